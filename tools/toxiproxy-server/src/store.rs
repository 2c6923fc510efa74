//! The set of proxies the API manages, and the running `noxious` proxy tasks.
//!
//! The store keeps each proxy's configuration and toxic list itself, because
//! a disabled proxy has no running task but must still show (and accept)
//! toxics, as in Toxiproxy. While a proxy runs, every toxic change is also
//! sent to its task through the library's own event channel, which rebuilds
//! the live links; the store's copy is changed only after the task accepts.
//!
//! That rebuild is not lossless in the library: it tears down every open
//! connection's toxic pipelines and drops whatever they hold (a latency toxic
//! holds up to 1024 chunks) while the connection goes on, so the peer would see
//! bytes vanish from the middle of a TCP stream, which no real network does. A
//! change that would do that closes the proxy's open connections instead, as a
//! disable does, and listens again with the new toxics (`Proxy::change`). So
//! does removing a `timeout` toxic: the bytes it discarded are a hole in each
//! open connection's stream, and Toxiproxy's timeout toxic closes its
//! connections when it is removed.

use crate::cable;
use crate::error::ApiError;
use crate::fields;
use crate::reset;
use crate::toxics::{self, ApiToxic};
use noxious::bytes::{ByteCounters, DirectionBytes};
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::SocketListener;
use noxious::state::{ProxyState, SharedProxyInfo};
use noxious::toxic::{
    StreamDirection, Toxic, ToxicEvent, ToxicEventKind, ToxicEventResult, ToxicKind,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long a stop waits for the library to drop the proxy's client connections.
const CONNECTION_DRAIN: Duration = Duration::from_secs(2);

/// What Toxiproxy listens on when a proxy is created without `listen`
/// (Go's `net.Listen("tcp", "")`: every interface, a free port).
const DEFAULT_LISTEN: &str = "0.0.0.0:0";

type EventSender = bmrng::RequestSender<ToxicEvent, ToxicEventResult>;

#[derive(Debug)]
struct Running {
    events: EventSender,
    stopper: Stopper,
    closed: Close,
    info: SharedProxyInfo,
    /// One watcher per `reset_peer` toxic: its name, what it was started with, its task.
    resets: BTreeMap<String, (ApiToxic, JoinHandle<()>)>,
}

impl Running {
    /// Start a watcher for each `reset_peer` toxic that has none, stop those of toxics
    /// removed or changed; unchanged ones keep their connections' deadlines.
    fn sync_resets(&mut self, config: &ProxyConfig, toxics: &[ApiToxic]) {
        let wanted: BTreeMap<&str, &ApiToxic> = toxics
            .iter()
            .filter(|t| t.reset_after_ms.is_some())
            .map(|t| (t.name(), t))
            .collect();
        self.resets.retain(|name, (started, handle)| {
            let keep = wanted.get(name.as_str()) == Some(&&*started);
            if !keep {
                handle.abort();
            }
            keep
        });
        let listen_port = config
            .listen
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or(0);
        for (name, toxic) in wanted {
            if self.resets.contains_key(name) {
                continue;
            }
            let target = reset::Target {
                proxy: config.name.clone(),
                listen_port,
                upstream: config.upstream.clone(),
                direction: toxic.toxic.direction,
                timeout: Duration::from_millis(toxic.reset_after_ms.unwrap_or(0)),
            };
            let handle = reset::spawn(self.info.state.clone(), target);
            self.resets
                .insert(name.to_owned(), ((*toxic).clone(), handle));
        }
    }
}

/// One proxy: its configuration, its toxics and, while enabled, its task.
#[derive(Debug)]
pub struct Proxy {
    config: ProxyConfig,
    toxics: Vec<ApiToxic>,
    running: Option<Running>,
    /// What the proxy's connections carried since it was created, across disables and restarts
    /// (the patched library counts in its copy loops, `vendor/noxious/src/bytes.rs`).
    bytes: ByteCounters,
}

/// The fields of a proxy as the API accepts them on create, populate and update.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxySpec {
    pub name: String,
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
}

impl ProxySpec {
    /// Read a create/populate body; `position` names the entry in a populate list.
    pub fn parse(body: &Value, position: Option<usize>) -> Result<ProxySpec, ApiError> {
        let map = fields::object(body)?;
        let at = |field: &str| match position {
            Some(i) => format!("{field} at proxy {i}"),
            None => field.to_owned(),
        };
        let name = fields::string(map, "name")?.unwrap_or_default();
        if name.is_empty() {
            return Err(ApiError::missing_field(at("name")));
        }
        if name.contains('/') {
            return Err(ApiError::bad_request_body(
                "proxy name must not contain '/'",
            ));
        }
        let upstream = fields::string(map, "upstream")?.unwrap_or_default();
        if upstream.is_empty() {
            return Err(ApiError::missing_field(at("upstream")));
        }
        let listen = fields::string(map, "listen")?.unwrap_or_default();
        Ok(ProxySpec {
            name,
            listen: if listen.is_empty() {
                DEFAULT_LISTEN.to_owned()
            } else {
                listen
            },
            upstream,
            enabled: fields::boolean(map, "enabled")?.unwrap_or(true),
        })
    }
}

/// Turn `host:0` into `host:<free port>` so the API can report the real port.
///
/// The library binds the address it is given and does not expose the bound
/// port, so a free port is found here first. Another process could take the
/// port between this probe and the library's bind; the bind then fails with
/// a clear error instead of silently using a different port.
fn resolve_listen(listen: &str) -> Result<String, ApiError> {
    let Some((_, port)) = listen.rsplit_once(':') else {
        return Ok(listen.to_owned());
    };
    if port != "0" {
        return Ok(listen.to_owned());
    }
    let addr = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            ApiError::internal(format!("listen tcp {listen}: cannot resolve address"))
        })?;
    let probe = std::net::TcpListener::bind(addr)
        .map_err(|err| ApiError::internal(format!("listen tcp {listen}: {err}")))?;
    let bound = probe
        .local_addr()
        .map_err(|err| ApiError::internal(format!("listen tcp {listen}: {err}")))?;
    Ok(bound.to_string())
}

impl Proxy {
    fn new(spec: &ProxySpec, seed: Option<u64>) -> Proxy {
        Proxy {
            config: ProxyConfig {
                name: spec.name.clone(),
                listen: spec.listen.clone(),
                upstream: spec.upstream.clone(),
                enabled: false,
                rand_seed: seed,
            },
            toxics: Vec::new(),
            running: None,
            bytes: ByteCounters::default(),
        }
    }

    /// The proxy as Toxiproxy serves it, with its toxics, and (fields Toxiproxy lacks) the
    /// bytes each direction read from its sender and wrote to its receiver, and the connections
    /// it accepted and closed at once because the upstream connect failed.
    pub fn to_json(&self) -> Value {
        let counted = |d: &DirectionBytes| json!({"read": d.read(), "written": d.written()});
        json!({
            "name": self.config.name,
            "listen": self.config.listen,
            "upstream": self.config.upstream,
            "enabled": self.running.is_some(),
            "toxics": self.toxics_json(),
            "bytes": {
                "upstream": counted(&self.bytes.upstream),
                "downstream": counted(&self.bytes.downstream),
            },
            "connections": {
                "accepted": self.bytes.connections.accepted(),
                "upstream_failed": self.bytes.connections.upstream_failed(),
            },
        })
    }

    pub fn toxics_json(&self) -> Value {
        Value::Array(self.toxics.iter().map(toxics::to_json).collect())
    }

    pub fn toxic(&self, name: &str) -> Result<&ApiToxic, ApiError> {
        self.toxics
            .iter()
            .find(|t| t.name() == name)
            .ok_or_else(ApiError::toxic_not_found)
    }

    fn library_toxics(&self) -> Toxics {
        let of = |direction| {
            self.toxics
                .iter()
                .filter(|t| t.toxic.direction == direction)
                .map(|t| t.toxic.clone())
                .collect()
        };
        Toxics {
            upstream: of(StreamDirection::Upstream),
            downstream: of(StreamDirection::Downstream),
        }
    }

    /// Bind the listen address and hand the listener to a library proxy task.
    async fn start(&mut self) -> Result<(), ApiError> {
        if self.running.is_some() {
            return Ok(());
        }
        let mut config = self.config.clone();
        config.listen = resolve_listen(&config.listen)?;
        config.enabled = true;
        // What the library's `initialize_proxy` does, with the proxy's own counters.
        let listener = cable::Listener::bind(&config.listen)
            .await
            .map_err(|err| ApiError::internal(format!("listen tcp {}: {err}", config.listen)))?;
        let info = SharedProxyInfo {
            state: Arc::new(ProxyState::with_bytes(
                self.library_toxics(),
                self.bytes.clone(),
            )),
            config: Arc::new(config.clone()),
        };
        let (events, receiver) = bmrng::channel(1);
        let (stop, stopper) = Stop::new();
        let (closed, closer) = Close::new();
        let name = config.name.clone();
        let task_info = info.clone();
        tokio::spawn(async move {
            let result = ProxyRunner::run_proxy(listener, task_info, receiver, stop, closer).await;
            if let Err(err) = result {
                eprintln!("brokerchaos-toxiproxy: proxy {name} stopped accepting: {err}");
            }
        });
        eprintln!(
            "brokerchaos-toxiproxy: proxy {} listening on {} -> {}",
            config.name, config.listen, config.upstream
        );
        let mut running = Running {
            events,
            stopper,
            closed,
            info,
            resets: BTreeMap::new(),
        };
        running.sync_resets(&config, &self.toxics);
        self.config = config;
        self.running = Some(running);
        Ok(())
    }

    /// Stop listening and close every client connection, as Toxiproxy's disable does.
    async fn stop(&mut self) {
        self.config.enabled = false;
        let Some(running) = self.running.take() else {
            return;
        };
        for (_, handle) in running.resets.values() {
            handle.abort();
        }
        running.stopper.stop();
        let _ = running.closed.recv().await;
        // The library drops each connection's sockets from its own tasks once
        // the stop signal reaches them; wait so that the caller sees them closed.
        let deadline = tokio::time::Instant::now() + CONNECTION_DRAIN;
        while !running.info.state.lock().clients.is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!(
            "brokerchaos-toxiproxy: proxy {} stopped ({})",
            self.config.name, self.config.listen
        );
    }

    /// Send a toxic change to the running task, if any; the library rebuilds live links.
    async fn apply(&mut self, kind: ToxicEventKind) -> Result<(), ApiError> {
        let Some(running) = &self.running else {
            return Ok(());
        };
        let event = ToxicEvent::new(self.config.name.clone(), kind);
        match running.events.send_receive(event).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(ApiError::internal(format!(
                "proxy {} rejected the toxic change: {err}",
                self.config.name
            ))),
            Err(err) => Err(ApiError::internal(format!(
                "proxy {} is not running: {err}",
                self.config.name
            ))),
        }
    }

    /// Whether rebuilding the open connections' links now would drop bytes they carry.
    ///
    /// A direction without toxics is forwarded directly and its rebuild loses
    /// nothing; a direction where a timeout toxic runs on every connection
    /// discards its bytes anyway (what a partition means). Any other toxic
    /// passes data on and holds some of it in its pipeline.
    fn rebuild_drops_bytes(&self) -> bool {
        let discards_all =
            |t: &&Toxic| matches!(t.kind, ToxicKind::Timeout { .. }) && t.toxicity >= 1.0;
        [StreamDirection::Upstream, StreamDirection::Downstream]
            .into_iter()
            .any(|direction| {
                let chain: Vec<&Toxic> = self
                    .toxics
                    .iter()
                    .map(|t| &t.toxic)
                    .filter(|t| t.direction == direction)
                    .collect();
                !chain.is_empty() && !chain.iter().any(discards_all)
            })
    }

    /// Whether the change takes a `timeout` toxic (or a `reset_peer`, which the library runs
    /// as one) off connections whose bytes it may have discarded.
    ///
    /// Those connections would go on from wherever the discarded bytes left their streams,
    /// a hole no TCP connection can have. Toxiproxy closes them: its timeout toxic's cleanup,
    /// run when the toxic is removed, closes each connection's link. An update that keeps
    /// the toxic discarding on every connection (a timeout toxic at toxicity 1) leaves them
    /// open; one that lowers its toxicity could let some of them pass again, so it closes
    /// them too (Toxiproxy would leave them open with the hole).
    fn ends_a_discard(&self, kind: &ToxicEventKind) -> bool {
        let discards = |t: &Toxic| matches!(t.kind, ToxicKind::Timeout { .. });
        let was_discarding = |name: &str| {
            self.toxics
                .iter()
                .any(|t| t.name() == name && discards(&t.toxic))
        };
        match kind {
            ToxicEventKind::RemoveToxic(name) => was_discarding(name),
            ToxicEventKind::UpdateToxic(new) => {
                was_discarding(&new.name) && !(discards(new) && new.toxicity >= 1.0)
            }
            _ => false,
        }
    }

    /// Change the toxic list, on open connections too, without ever letting a stream
    /// through with bytes missing from its middle.
    ///
    /// Through the library's event when its rebuild is lossless and no discarded
    /// bytes are behind the change; otherwise the open connections are closed (their
    /// peers see a close, not a gap) and the proxy listens again at once with the new
    /// list.
    async fn change(
        &mut self,
        kind: ToxicEventKind,
        edit: impl FnOnce(&mut Vec<ApiToxic>),
    ) -> Result<(), ApiError> {
        let why = if self.ends_a_discard(&kind) {
            Some("a timeout toxic discarded bytes of their streams")
        } else if self.rebuild_drops_bytes() {
            Some("the library would drop the bytes their toxics hold")
        } else {
            None
        };
        if let (Some(why), true) = (why, self.running.is_some()) {
            eprintln!(
                "brokerchaos-toxiproxy: proxy {}: closing open connections for a toxic change \
                 ({why})",
                self.config.name
            );
            self.stop().await;
            edit(&mut self.toxics);
            return self.start().await;
        }
        self.apply(kind).await?;
        edit(&mut self.toxics);
        if let Some(running) = &mut self.running {
            running.sync_resets(&self.config, &self.toxics);
        }
        Ok(())
    }

    pub async fn add_toxic(&mut self, toxic: ApiToxic) -> Result<&ApiToxic, ApiError> {
        if self.toxics.iter().any(|t| t.name() == toxic.name()) {
            return Err(ApiError::toxic_exists());
        }
        let event = ToxicEventKind::AddToxic(toxic.toxic.clone());
        self.change(event, |toxics| toxics.push(toxic)).await?;
        Ok(self.toxics.last().expect("just pushed"))
    }

    pub async fn update_toxic(&mut self, toxic: ApiToxic) -> Result<&ApiToxic, ApiError> {
        let index = self
            .toxics
            .iter()
            .position(|t| t.name() == toxic.name())
            .ok_or_else(ApiError::toxic_not_found)?;
        let event = ToxicEventKind::UpdateToxic(toxic.toxic.clone());
        self.change(event, |toxics| toxics[index] = toxic).await?;
        Ok(&self.toxics[index])
    }

    pub async fn remove_toxic(&mut self, name: &str) -> Result<(), ApiError> {
        let index = self
            .toxics
            .iter()
            .position(|t| t.name() == name)
            .ok_or_else(ApiError::toxic_not_found)?;
        self.change(ToxicEventKind::RemoveToxic(name.to_owned()), |toxics| {
            toxics.remove(index);
        })
        .await
    }

    /// Remove toxics one by one: noxious 1.0.4's `RemoveAllToxics` event clears
    /// only the upstream list and leaves downstream toxics running.
    async fn remove_all_toxics(&mut self) -> Result<(), ApiError> {
        while let Some(toxic) = self.toxics.last() {
            let name = toxic.name().to_owned();
            self.remove_toxic(&name).await?;
        }
        Ok(())
    }

    /// Apply a `POST /proxies/{name}` body: a new address restarts the proxy.
    pub async fn update(&mut self, body: &Value) -> Result<(), ApiError> {
        let map = fields::object(body)?;
        let listen = fields::string(map, "listen")?.unwrap_or_else(|| self.config.listen.clone());
        let upstream =
            fields::string(map, "upstream")?.unwrap_or_else(|| self.config.upstream.clone());
        let enabled = fields::boolean(map, "enabled")?.unwrap_or(self.running.is_some());
        if listen != self.config.listen || upstream != self.config.upstream {
            self.stop().await;
            self.config.listen = listen;
            self.config.upstream = upstream;
        }
        if enabled {
            self.start().await
        } else {
            self.stop().await;
            Ok(())
        }
    }
}

/// All proxies by name; the API serialises access to it.
#[derive(Debug, Default)]
pub struct Store {
    proxies: BTreeMap<String, Proxy>,
    seed: Option<u64>,
}

impl Store {
    pub fn new(seed: Option<u64>) -> Store {
        Store {
            proxies: BTreeMap::new(),
            seed,
        }
    }

    pub fn get(&self, name: &str) -> Result<&Proxy, ApiError> {
        self.proxies.get(name).ok_or_else(ApiError::proxy_not_found)
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut Proxy, ApiError> {
        self.proxies
            .get_mut(name)
            .ok_or_else(ApiError::proxy_not_found)
    }

    pub fn to_json(&self) -> Value {
        Value::Object(
            self.proxies
                .iter()
                .map(|(name, proxy)| (name.clone(), proxy.to_json()))
                .collect(),
        )
    }

    /// Create a proxy; it is stored only if it could start (when enabled).
    pub async fn create(&mut self, spec: &ProxySpec) -> Result<&Proxy, ApiError> {
        if self.proxies.contains_key(&spec.name) {
            return Err(ApiError::proxy_exists());
        }
        let mut proxy = Proxy::new(spec, self.seed);
        if spec.enabled {
            proxy.start().await?;
        }
        Ok(self.proxies.entry(spec.name.clone()).or_insert(proxy))
    }

    pub async fn delete(&mut self, name: &str) -> Result<(), ApiError> {
        let mut proxy = self
            .proxies
            .remove(name)
            .ok_or_else(ApiError::proxy_not_found)?;
        proxy.stop().await;
        Ok(())
    }

    /// Create or replace each proxy in order, as Toxiproxy's `/populate` does.
    ///
    /// A proxy whose listen and upstream are unchanged is kept as it is (with
    /// its toxics); any other existing proxy of that name is replaced. On the
    /// first failure the proxies handled so far are returned with the error.
    pub async fn populate(&mut self, specs: &[ProxySpec]) -> (Vec<Value>, Option<ApiError>) {
        let mut done = Vec::new();
        for spec in specs {
            let unchanged = self.proxies.get(&spec.name).is_some_and(|p| {
                p.config.listen == spec.listen && p.config.upstream == spec.upstream
            });
            if !unchanged {
                if let Some(mut old) = self.proxies.remove(&spec.name) {
                    old.stop().await;
                }
                if let Err(err) = self.create(spec).await {
                    return (done, Some(err));
                }
            }
            done.push(self.proxies[&spec.name].to_json());
        }
        (done, None)
    }

    /// Enable every proxy and remove every toxic.
    pub async fn reset(&mut self) -> Result<(), ApiError> {
        for proxy in self.proxies.values_mut() {
            proxy.start().await?;
            proxy.remove_all_toxics().await?;
        }
        Ok(())
    }
}
