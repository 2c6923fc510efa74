mod bandwidth;
mod latency;
mod limit_data;
mod noop;
mod slicer;
mod slow_close;
#[cfg(test)]
mod test_utils;
mod timeout;

pub(crate) use bandwidth::*;
pub(crate) use latency::*;
pub(crate) use limit_data::*;
pub(crate) use noop::*;
pub(crate) use slicer::*;
pub(crate) use slow_close::*;
pub(crate) use timeout::*;
