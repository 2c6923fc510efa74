//! `brokerchaos-toxiproxy`: Toxiproxy's HTTP API in front of the `noxious` proxy library.
//!
//! The Rust port's own server is not published as a crate, only its core
//! library is; this binary supplies the missing API front so that the
//! project's harness (and `toxiproxy-python`) can drive network faults.

mod api;
mod cable;
mod error;
mod fields;
mod reset;
mod sockets;
mod store;
mod toxics;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::process::ExitCode;
use std::sync::Arc;
use store::Store;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Mutex;

const USAGE: &str = "\
usage: brokerchaos-toxiproxy [--host HOST] [--port PORT] [--config FILE] [--seed N]

  --host HOST    address the API listens on (default 127.0.0.1)
  --port PORT    port the API listens on (default 8474)
  --config FILE  JSON array of proxies to create at start-up (Toxiproxy's -config format)
  --seed N       seed for the random parts of toxics (toxicity, jitter, slicer sizes)";

#[derive(Debug, PartialEq)]
struct Options {
    host: String,
    port: u16,
    config: Option<String>,
    seed: Option<u64>,
}

enum Parsed {
    Run(Options),
    Help,
    Version,
}

/// Accept Toxiproxy's Go-style flags (`-port 1`, `-port=1`) as well as `--port`.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut opts = Options {
        host: "127.0.0.1".to_owned(),
        port: 8474,
        config: None,
        seed: None,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let flag = arg.trim_start_matches('-');
        if flag.len() == arg.len() {
            return Err(format!("unexpected argument {arg:?}"));
        }
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        match name {
            "h" | "help" => return Ok(Parsed::Help),
            "version" => return Ok(Parsed::Version),
            "host" | "port" | "config" | "seed" => {}
            _ => return Err(format!("unknown option {arg:?}")),
        }
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .ok_or_else(|| format!("option --{name} needs a value"))?,
        };
        match name {
            "host" => opts.host = value,
            "port" => {
                opts.port = value
                    .parse()
                    .map_err(|_| format!("--port must be a port number, got {value:?}"))?
            }
            "config" => opts.config = Some(value),
            _ => {
                let seed = value
                    .parse::<u64>()
                    .or_else(|_| value.parse::<i64>().map(|v| v as u64))
                    .map_err(|_| format!("--seed must be an integer, got {value:?}"))?;
                opts.seed = Some(seed);
            }
        }
    }
    Ok(Parsed::Run(opts))
}

async fn load_config(store: &mut Store, path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read config file {path}: {err}"))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|err| format!("config file {path} is not valid JSON: {err}"))?;
    let specs = api::parse_proxy_list(&value)
        .map_err(|err| format!("config file {path}: {}", err.message))?;
    let (_, error) = store.populate(&specs).await;
    match error {
        Some(err) => Err(format!("config file {path}: {}", err.message)),
        None => {
            eprintln!(
                "brokerchaos-toxiproxy: created {} proxies from {path}",
                specs.len()
            );
            Ok(())
        }
    }
}

async fn serve(opts: Options) -> Result<(), String> {
    let mut store = Store::new(opts.seed);
    if let Some(path) = &opts.config {
        load_config(&mut store, path).await?;
    }
    let address = format!("{}:{}", opts.host, opts.port);
    let listener = TcpListener::bind(&address).await.map_err(|err| {
        format!("cannot listen on {address}: {err} (choose another --host/--port)")
    })?;
    eprintln!("brokerchaos-toxiproxy: API listening on {address}");
    let store = Arc::new(Mutex::new(store));
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|err| format!("cannot watch SIGTERM: {err}"))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|err| format!("cannot watch SIGINT: {err}"))?;
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    eprintln!("brokerchaos-toxiproxy: API accept failed: {err}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        };
        let store = store.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| api::handle(store.clone(), req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    eprintln!("brokerchaos-toxiproxy: shutting down");
    Ok(())
}

fn main() -> ExitCode {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Parsed::Run(opts)) => opts,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            println!(
                "brokerchaos-toxiproxy {} (Toxiproxy API {}, noxious 1.0.4, patched)",
                env!("CARGO_PKG_VERSION"),
                api::API_VERSION
            );
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("brokerchaos-toxiproxy: error: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("brokerchaos-toxiproxy: error: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("brokerchaos-toxiproxy: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        match parse_args(args.iter().map(|s| s.to_string()))? {
            Parsed::Run(opts) => Ok(opts),
            _ => Err("not a run".into()),
        }
    }

    #[test]
    fn go_and_gnu_flag_styles() {
        let opts = run(&["-host=0.0.0.0", "--port", "9000", "-seed", "-3"]).unwrap();
        assert_eq!(opts.host, "0.0.0.0");
        assert_eq!(opts.port, 9000);
        assert_eq!(opts.seed, Some((-3i64) as u64));
        assert!(run(&["--port", "x"]).is_err());
        assert!(run(&["--bogus"]).is_err());
        assert!(run(&["--config"]).is_err());
    }
}
