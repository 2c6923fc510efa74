use crate::bytes::DirectionBytes;
use crate::signal::Stop;
use crate::socket::{ReadStream, WriteStream};
use bytes::{Bytes, BytesMut};
use futures::{Sink, SinkExt, Stream, StreamExt};
use std::io;
use std::pin::Pin;

use tokio_util::codec::{BytesCodec, FramedRead, FramedWrite};

pub(crate) type Read = FramedRead<ReadStream, BytesCodec>;
pub(crate) type Write = FramedWrite<WriteStream, BytesCodec>;

/// brokerchaos: ``behind_cut``: the other direction of the connection is cut (it holds a
/// `timeout` toxic), so nothing of this direction's receiver may reach its sender, a failed write
/// (the receiver hung up) included: the direction goes on reading and discarding what its sender
/// writes, as a network that drops the receiver's RST would let it, instead of ending the
/// connection (which would close the sender's socket across the cut).
pub(crate) async fn forward(
    reader: &mut Read,
    writer: &mut Write,
    stop: &mut Stop,
    bytes: &DirectionBytes,
    behind_cut: bool,
) -> io::Result<()> {
    let mut writable = true;
    while !stop.stop_received() {
        let maybe_res: Option<io::Result<BytesMut>> = tokio::select! {
            res = reader.next() => res,
            _ = stop.recv() => None
        };
        if let Some(res) = maybe_res {
            match res {
                Ok(chunk) => {
                    let n = chunk.len();
                    bytes.add_read(n);
                    if !writable {
                        continue;
                    }
                    if let Err(_err) = writer.send(chunk.into()).await {
                        // writer closed
                        if behind_cut {
                            writable = false;
                            continue;
                        }
                        break;
                    }
                    bytes.add_written(n);
                }
                Err(err) => {
                    // reader closed
                    return Err(err);
                }
            }
        } else {
            // stop signal received
            break;
        }
    }
    Ok(())
}

pub(crate) async fn forward_read(
    mut reader: Read,
    mut writer: Pin<&mut impl Sink<Bytes>>,
    stop: &mut Stop,
    bytes: &DirectionBytes,
) -> io::Result<Read> {
    while !stop.stop_received() {
        let maybe_res: Option<io::Result<BytesMut>> = tokio::select! {
            res = reader.next() => res,
            _ = stop.recv() => None
        };
        if let Some(res) = maybe_res {
            match res {
                Ok(chunk) => {
                    bytes.add_read(chunk.len());
                    if let Err(_err) = writer.send(chunk.into()).await {
                        // writer channel closed
                        break;
                    }
                }
                Err(err) => {
                    // reader i/o error
                    return Err(err);
                }
            }
        } else {
            // stop signal received
            break;
        }
    }
    Ok(reader)
}

/// brokerchaos: ``behind_cut`` as for [`forward`]: a failed write discards what follows.
pub(crate) async fn forward_write(
    mut reader: Pin<&mut impl Stream<Item = Bytes>>,
    mut writer: Write,
    stop: &mut Stop,
    bytes: &DirectionBytes,
    behind_cut: bool,
) -> io::Result<Write> {
    let mut writable = true;
    while !stop.stop_received() {
        let maybe_chunk = tokio::select! {
            res = reader.next() => res,
            _ = stop.recv() => None
        };
        if let Some(chunk) = maybe_chunk {
            let n = chunk.len();
            if !writable {
                continue;
            }
            if writer.send(chunk).await.is_err() {
                // writer channel closed
                if behind_cut {
                    writable = false;
                    continue;
                }
                break;
            }
            bytes.add_written(n);
        } else {
            break;
        }
    }
    Ok(writer)
}
