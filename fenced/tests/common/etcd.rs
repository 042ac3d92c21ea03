//! A real etcd server for one test: started on free loopback ports with a temp data
//! dir, killed by PID on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary: `$FENCED_TEST_ETCD` or Debian's `/usr/bin/etcd`.
pub fn etcd_binary() -> String {
    std::env::var("FENCED_TEST_ETCD").unwrap_or_else(|_| "/usr/bin/etcd".to_owned())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// A running etcd.
#[derive(Debug)]
pub struct Etcd {
    child: Child,
    dir: tempfile::TempDir,
    client_port: u16,
}

impl Etcd {
    /// Starts etcd and waits until `/health` answers (at most 15 s).
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cp, pp) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let child = Command::new(etcd_binary())
            .args(["--name", "n1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--logger=zap", "--log-outputs=stderr"])
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .arg(format!("--initial-cluster=n1={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e} (apt-get install etcd-server)",
                    etcd_binary()
                )
            });
        let etcd = Self {
            child,
            dir,
            client_port: cp,
        };
        let t0 = Instant::now();
        while !etcd.healthy() {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "etcd not healthy after 15 s; log: {}",
                etcd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.contains("\"health\":\"true\"")
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// The PID (for the harness's own kill).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to exactly this PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
