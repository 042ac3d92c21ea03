//! The EC2 API peer for the EBS tests: a `moto_server` started on a free loopback port
//! (killed by PID on drop), fixtures set up with plain unsigned Query API requests (code
//! independent of the fencer's client), and a small HTTP proxy in front of moto that can
//! make `DetachVolume` asynchronous, as it is on AWS (moto detaches synchronously), add
//! the extra attachments of a Multi-Attach volume (moto keeps one per volume), and
//! corrupt answers ([`Corrupt`]); it also completes moto's IMDSv2 token answer.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Where the moto server lives: `$FENCED_MOTO_SERVER`, else the venv that
/// `scripts/install-deps` creates.
pub fn moto_server_path() -> PathBuf {
    let path = std::env::var_os("FENCED_MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/fenced-moto-venv/bin/moto_server"));
    assert!(
        path.exists(),
        "the EBS tests need moto's EC2 API server at {} (run scripts/install-deps, which creates \
         the venv: python3 -m venv /var/tmp/fenced-moto-venv && \
         /var/tmp/fenced-moto-venv/bin/pip install 'moto[server]'; or set FENCED_MOTO_SERVER)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// A running `moto_server`, killed on drop.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    /// Its address.
    pub addr: SocketAddr,
}

/// The peer shared by the tests that do not stop it: started by the first of them and
/// killed when the last one drops its handle (each test makes its own volumes and
/// instances). Sharing pays moto's start and first-RunInstances cost (seconds on a
/// loaded machine) once per test binary instead of once per test.
static SHARED: Mutex<Weak<Moto>> = Mutex::new(Weak::new());

impl Moto {
    /// A handle on the shared peer.
    pub fn shared() -> Arc<Self> {
        let mut w = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = w.upgrade() {
            return m;
        }
        let m = Arc::new(Self::start());
        *w = Arc::downgrade(&m);
        m
    }

    /// Starts moto on a free loopback port and waits until it answers HTTP.
    pub fn start() -> Self {
        let bin = moto_server_path();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // lost the port race: try another
                }
                if http_ok(addr) {
                    return Self { child, addr };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("moto_server did not come up on 127.0.0.1");
    }

    /// Its endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGSTOP: the peer stops answering (connections still queue).
    pub fn stop(&self) {
        signal(self.pid(), "-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

impl Drop for Moto {
    fn drop(&mut self) {
        // A stopped process still dies of SIGKILL.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_ok(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = StdStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.") && &buf[9..12] == b"200"
}

/// SDK config for the peer at `url`: the fencer's own loader (timeouts, retries,
/// endpoint override) plus static test credentials.
pub async fn sdk_config(config: &fenced::ebs::EbsConfig) -> aws_config::SdkConfig {
    config
        .loader()
        .credentials_provider(Credentials::new("testing", "testing", None, None, "static"))
        .load()
        .await
}

/// Sets up fixtures directly against moto with unsigned Query API requests (moto does
/// not check signatures), independent of the fencer's own EC2 client.
#[derive(Debug, Clone)]
pub struct Fixtures {
    addr: SocketAddr,
}

/// The fixture client for the peer at `url` (`http://127.0.0.1:PORT`).
pub async fn client(url: &str) -> Fixtures {
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("peer URL is http://127.0.0.1:PORT");
    Fixtures { addr }
}

impl Fixtures {
    /// One EC2 Query API call; panics (with the answer) unless moto answers 200.
    async fn call(&self, action: &str, params: &[(&str, &str)]) -> String {
        self.call_service("ec2", "2016-11-15", action, params).await
    }

    /// One Query API call to `service`.
    async fn call_service(
        &self,
        service: &str,
        version: &str,
        action: &str,
        params: &[(&str, &str)],
    ) -> String {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", action);
        form.append_pair("Version", version);
        for (k, v) in params {
            form.append_pair(k, v);
        }
        let body = form.finish();
        // moto routes a request to a service by the credential scope of its
        // Authorization header (without one it answers as S3); it does not check the
        // signature, so this one is a placeholder.
        let head = format!(
            "POST / HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-www-form-urlencoded; \
             charset=utf-8\r\nAuthorization: AWS4-HMAC-SHA256 \
             Credential=testing/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, \
             Signature=0\r\nContent-Length: {}",
            self.addr,
            body.len()
        );
        let req = Request {
            head,
            body: body.into_bytes(),
        };
        let answer = forward(self.addr, &req).await.expect("moto answers");
        let text = String::from_utf8_lossy(&answer).into_owned();
        let (status_line, rest) = text.split_once("\r\n").expect("HTTP answer");
        assert!(status_line.contains(" 200 "), "{action}: {text}");
        let (_, xml) = rest.split_once("\r\n\r\n").expect("HTTP answer body");
        xml.to_owned()
    }
}

impl Fixtures {
    /// An IAM user allowed `ec2:*`, and its access key: `(id, secret)`.
    pub async fn iam_user_with_ec2_access(&self, name: &str) -> (String, String) {
        const IAM: (&str, &str) = ("iam", "2010-05-08");
        self.call_service(IAM.0, IAM.1, "CreateUser", &[("UserName", name)])
            .await;
        let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ec2:*","Resource":"*"}]}"#;
        self.call_service(
            IAM.0,
            IAM.1,
            "PutUserPolicy",
            &[
                ("UserName", name),
                ("PolicyName", "fencer"),
                ("PolicyDocument", policy),
            ],
        )
        .await;
        let xml = self
            .call_service(IAM.0, IAM.1, "CreateAccessKey", &[("UserName", name)])
            .await;
        (
            texts(&xml, "AccessKeyId").remove(0),
            texts(&xml, "SecretAccessKey").remove(0),
        )
    }

    /// Makes moto check every request's SigV4 signature and IAM permissions from now on
    /// (`enforce`), or stop checking. Global to that moto process.
    pub async fn enforce_auth(&self, enforce: bool) {
        let count = if enforce { "0" } else { "1000000000" };
        let head = format!(
            "POST /moto-api/reset-auth HTTP/1.1\r\nHost: {}\r\nContent-Length: {}",
            self.addr,
            count.len()
        );
        let req = Request {
            head,
            body: count.as_bytes().to_vec(),
        };
        let answer = forward(self.addr, &req).await.expect("moto answers");
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"),
            "{text}"
        );
    }
}

fn texts(xml: &str, tag: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(xml).expect("moto answers XML");
    doc.descendants()
        .filter(|n| n.has_tag_name(tag))
        .map(|n| n.text().unwrap_or_default().to_owned())
        .collect()
}

/// Launches one instance.
pub async fn run_instance(c: &Fixtures) -> String {
    let xml = c
        .call(
            "RunInstances",
            &[
                ("ImageId", "ami-12c6146b"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
            ],
        )
        .await;
    texts(&xml, "instanceId").remove(0)
}

/// Creates an io2 volume in us-east-1a.
pub async fn create_volume(c: &Fixtures) -> String {
    let xml = c
        .call(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "8"),
                ("VolumeType", "io2"),
                ("Iops", "100"),
            ],
        )
        .await;
    texts(&xml, "volumeId").remove(0)
}

/// Attaches `volume` to `instance`.
pub async fn attach(c: &Fixtures, volume: &str, instance: &str) {
    c.call(
        "AttachVolume",
        &[
            ("VolumeId", volume),
            ("InstanceId", instance),
            ("Device", "/dev/sdf"),
        ],
    )
    .await;
}

/// A new instance with a new volume attached to it: `(instance, volume)`.
pub async fn attached_volume(c: &Fixtures) -> (String, String) {
    let instance = run_instance(c).await;
    let volume = create_volume(c).await;
    attach(c, &volume, &instance).await;
    (instance, volume)
}

/// The instances `volume` is attached to, as DescribeVolumes says (not `detached`).
pub async fn attached_to(c: &Fixtures, volume: &str) -> Vec<String> {
    let xml = c.call("DescribeVolumes", &[("VolumeId.1", volume)]).await;
    let doc = roxmltree::Document::parse(&xml).expect("moto answers XML");
    let child = |n: roxmltree::Node<'_, '_>, tag: &str| {
        n.children()
            .find(|c| c.has_tag_name(tag))
            .and_then(|c| c.text())
            .unwrap_or_default()
            .to_owned()
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("attachmentSet"))
        .flat_map(|set| set.children().filter(|c| c.has_tag_name("item")))
        .filter(|a| child(*a, "status") != "detached")
        .map(|a| child(a, "instanceId"))
        .collect()
}

/// A loopback HTTP proxy in front of moto. With a detach delay, it answers
/// `DetachVolume` at once with `detaching` and forwards it to moto only after the delay:
/// the detach is then asynchronous, as on AWS, and `DescribeVolumes` (always forwarded)
/// keeps listing the attachment until moto performs it.
#[derive(Debug)]
pub struct Proxy {
    /// Its address.
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

/// How the proxy damages answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corrupt {
    /// Answers pass unchanged.
    Nothing,
    /// `DescribeVolumes` answers lose their `attachmentSet` elements.
    DropAttachmentSet,
    /// `DescribeVolumes` answers are cut in the middle of their XML (with a matching
    /// `Content-Length`).
    Truncate,
    /// `DetachVolume` is answered `InvalidInstanceID.NotFound` (not forwarded).
    InstanceNotFound,
}

/// Extra attachments the proxy adds to one volume (Multi-Attach): `(volume, instance)`.
type Extra = Vec<(String, String)>;

#[derive(Debug)]
struct ProxyState {
    upstream: SocketAddr,
    corrupt: Mutex<Corrupt>,
    extra: Mutex<Extra>,
    detach_delay_ms: AtomicU64,
    detaches: AtomicU32,
    describes: AtomicU32,
    forwarded_detaches: AtomicU32,
    detach_seen: Notify,
}

impl Proxy {
    /// A proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(ProxyState {
            upstream,
            corrupt: Mutex::new(Corrupt::Nothing),
            extra: Mutex::new(Vec::new()),
            detach_delay_ms: AtomicU64::new(0),
            detaches: AtomicU32::new(0),
            describes: AtomicU32::new(0),
            forwarded_detaches: AtomicU32::new(0),
            detach_seen: Notify::new(),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, st.clone()));
            }
        });
        Self { addr, state, task }
    }

    /// Its endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Makes DetachVolume take `d` to complete (zero: forward at once).
    pub fn set_detach_delay(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.state.detach_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Damages answers from now on (see [`Corrupt`]).
    pub fn set_corrupt(&self, c: Corrupt) {
        *self.state.corrupt.lock().unwrap() = c;
    }

    /// Multi-Attach, which moto lacks: `DescribeVolumes` answers for `volume` also list
    /// `instance` as `attached`, until a `DetachVolume` for that pair (answered by the
    /// proxy, not forwarded) removes it.
    pub fn add_attachment(&self, volume: &str, instance: &str) {
        self.state
            .extra
            .lock()
            .unwrap()
            .push((volume.to_owned(), instance.to_owned()));
    }

    /// DetachVolume requests received.
    pub fn detaches(&self) -> u32 {
        self.state.detaches.load(Ordering::SeqCst)
    }

    /// DetachVolume requests forwarded to moto (performed).
    pub fn forwarded_detaches(&self) -> u32 {
        self.state.forwarded_detaches.load(Ordering::SeqCst)
    }

    /// DescribeVolumes requests received.
    pub fn describes(&self) -> u32 {
        self.state.describes.load(Ordering::SeqCst)
    }

    /// Waits for the next DetachVolume request to arrive.
    pub async fn detach_arrived(&self) {
        self.state.detach_seen.notified().await;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One HTTP/1.1 request: head (request line + headers) and body.
struct Request {
    head: String,
    body: Vec<u8>,
}

async fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Request { head, body })
}

fn form_value(body: &str, key: &str) -> Option<String> {
    body.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_owned())
    })
}

/// Sends `req` to moto with `Connection: close` and returns its whole answer.
async fn forward(upstream: SocketAddr, req: &Request) -> std::io::Result<Vec<u8>> {
    let mut up = TcpStream::connect(upstream).await?;
    let mut head = String::new();
    for (i, line) in req.head.trim_end().split("\r\n").enumerate() {
        let is_conn = line
            .split_once(':')
            .is_some_and(|(k, _)| k.eq_ignore_ascii_case("connection"));
        if i == 0 || !is_conn {
            head.push_str(line);
            head.push_str("\r\n");
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    up.write_all(head.as_bytes()).await?;
    up.write_all(&req.body).await?;
    let mut out = Vec::new();
    up.read_to_end(&mut out).await?;
    Ok(out)
}

async fn serve(mut conn: TcpStream, st: Arc<ProxyState>) {
    // One request per connection, answered with `Connection: close`.
    let Some(req) = read_request(&mut conn).await else {
        return;
    };
    let body = String::from_utf8_lossy(&req.body).into_owned();
    let action = form_value(&body, "Action").unwrap_or_default();
    let delay = Duration::from_millis(st.detach_delay_ms.load(Ordering::SeqCst));
    let corrupt = *st.corrupt.lock().unwrap();
    let vol = form_value(&body, "VolumeId").unwrap_or_default();
    let inst = form_value(&body, "InstanceId").unwrap_or_default();
    let answer = match action.as_str() {
        "DetachVolume" if corrupt == Corrupt::InstanceNotFound => {
            st.detaches.fetch_add(1, Ordering::SeqCst);
            st.detach_seen.notify_waiters();
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
                 <Code>InvalidInstanceID.NotFound</Code><Message>The instance ID '{inst}' does \
                 not exist</Message></Error></Errors><RequestID>proxy</RequestID></Response>"
            );
            Ok(http_answer("400 Bad Request", &xml))
        }
        "DetachVolume" if take_extra(&st, &vol, &inst) => {
            st.detaches.fetch_add(1, Ordering::SeqCst);
            st.detach_seen.notify_waiters();
            Ok(http_answer("200 OK", &detach_xml(&vol, &inst, "detaching")))
        }
        "DetachVolume" => {
            st.detaches.fetch_add(1, Ordering::SeqCst);
            st.detach_seen.notify_waiters();
            if delay.is_zero() {
                st.forwarded_detaches.fetch_add(1, Ordering::SeqCst);
                forward(st.upstream, &req).await
            } else {
                let st2 = st.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    st2.forwarded_detaches.fetch_add(1, Ordering::SeqCst);
                    let _ = forward(st2.upstream, &req).await;
                });
                Ok(http_answer("200 OK", &detach_xml(&vol, &inst, "detaching")))
            }
        }
        // moto also serves IMDSv2, but answers the token without the TTL header that
        // aws-config's IMDS client requires: added here.
        _ if req.head.starts_with("PUT /latest/api/token ") => {
            forward(st.upstream, &req).await.map(|a| {
                let text = String::from_utf8_lossy(&a).into_owned();
                text.replacen(
                    "\r\n",
                    "\r\nx-aws-ec2-metadata-token-ttl-seconds: 21600\r\n",
                    1,
                )
                .into_bytes()
            })
        }
        other => {
            let describe = other == "DescribeVolumes";
            if describe {
                st.describes.fetch_add(1, Ordering::SeqCst);
            }
            let answer = forward(st.upstream, &req).await;
            if describe {
                let asked = form_value(&body, "VolumeId.1").unwrap_or_default();
                let extra: Vec<String> = st
                    .extra
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(v, _)| *v == asked)
                    .map(|(_, i)| i.clone())
                    .collect();
                answer.map(|a| rewrite_body(&a, |xml| damage(xml, &asked, &extra, corrupt)))
            } else {
                answer
            }
        }
    };
    if let Ok(bytes) = answer {
        let _ = conn.write_all(&bytes).await;
        let _ = conn.shutdown().await;
    }
}

fn take_extra(st: &ProxyState, vol: &str, inst: &str) -> bool {
    let mut extra = st.extra.lock().unwrap();
    let before = extra.len();
    extra.retain(|(v, i)| !(v == vol && i == inst));
    extra.len() != before
}

fn detach_xml(vol: &str, inst: &str, status: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DetachVolumeResponse \
         xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>proxy</requestId>\
         <volumeId>{vol}</volumeId><instanceId>{inst}</instanceId><device>/dev/sdf</device>\
         <status>{status}</status></DetachVolumeResponse>"
    )
}

fn http_answer(status: &str, xml: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/xml;charset=UTF-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{xml}",
        xml.len()
    )
    .into_bytes()
}

/// A `DescribeVolumes` answer with the extra attachments added, then damaged.
fn damage(xml: &str, vol: &str, extra: &[String], corrupt: Corrupt) -> String {
    let mut xml = xml.to_owned();
    if !extra.is_empty() {
        let items: String = extra
            .iter()
            .map(|i| {
                format!(
                    "<item><volumeId>{vol}</volumeId><instanceId>{i}</instanceId>\
                     <device>/dev/sdg</device><status>attached</status></item>"
                )
            })
            .collect();
        xml = if xml.contains("<attachmentSet/>") {
            xml.replace(
                "<attachmentSet/>",
                &format!("<attachmentSet>{items}</attachmentSet>"),
            )
        } else {
            xml.replace("<attachmentSet>", &format!("<attachmentSet>{items}"))
        };
    }
    match corrupt {
        Corrupt::DropAttachmentSet => {
            while let Some(a) = xml.find("<attachmentSet") {
                let end = if xml[a..].starts_with("<attachmentSet/>") {
                    a + "<attachmentSet/>".len()
                } else {
                    let close = "</attachmentSet>";
                    a + xml[a..].find(close).expect("closed attachmentSet") + close.len()
                };
                xml.replace_range(a..end, "");
            }
            xml
        }
        Corrupt::Truncate => {
            let mut cut = xml.len() / 2;
            while !xml.is_char_boundary(cut) {
                cut -= 1;
            }
            xml[..cut].to_owned()
        }
        Corrupt::Nothing | Corrupt::InstanceNotFound => xml,
    }
}

/// `answer` (a whole HTTP/1.1 answer) with its body replaced by `f(body)` and its
/// `Content-Length` set to match.
fn rewrite_body(answer: &[u8], f: impl FnOnce(&str) -> String) -> Vec<u8> {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return answer.to_vec();
    };
    let body = f(body);
    let mut out = String::new();
    for line in head.split("\r\n") {
        let is_len = line
            .split_once(':')
            .is_some_and(|(k, _)| k.eq_ignore_ascii_case("content-length"));
        if !is_len {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    out.into_bytes()
}
