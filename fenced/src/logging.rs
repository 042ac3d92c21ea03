//! Logging of `fenced`: text or JSON lines on stderr, one line per event whatever the
//! values hold.
//!
//! Strings from the command line and from etcd reach the logs: an instance id, a key
//! under the root, an error message quoting a value. In text logs every control
//! character inside an event is escaped (`\n` → `\\n`) by the writer itself, so no
//! value can start a line of its own and forge an event, on this host or on the peers
//! that log it. JSON lines are escaped by the JSON encoder.

use std::io::{IsTerminal, Write};

/// `text` with every control character escaped: `\n`, `\r`, `\t` as such, others as
/// `\u{XX}`; safe to print as part of one line.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Escapes the control bytes of one formatted event except its final newline
/// (and, when colours are on, the formatter's own ESC sequences).
fn escape_event(event: &[u8], keep_esc: bool) -> Vec<u8> {
    let (body, end) = match event.split_last() {
        Some((b'\n', body)) => (body, &b"\n"[..]),
        _ => (event, &b""[..]),
    };
    let mut out = Vec::with_capacity(event.len() + 8);
    for &b in body {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.push(b),
            0x1b if keep_esc => out.push(b),
            b if b < 0x20 || b == 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            b => out.push(b),
        }
    }
    out.extend_from_slice(end);
    out
}

/// stderr, one escaped event per write (tracing-subscriber's formatter hands each
/// event over in one `write_all`).
#[derive(Debug, Clone, Copy)]
struct OneLineStderr {
    ansi: bool,
}

impl Write for OneLineStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write_all(&escape_event(buf, self.ansi))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for OneLineStderr {
    type Writer = Self;
    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// Installs the subscriber: `FENCED_LOG` filter (else `default_filter`), JSON or
/// escaped text on stderr.
pub fn init(json: bool, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FENCED_LOG")
        .unwrap_or_else(|_| default_filter.into());
    let ansi = !json && std::io::stderr().is_terminal();
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(OneLineStderr { ansi });
    if json {
        let _ = b.json().try_init();
    } else {
        let _ = b.try_init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_one_line() {
        assert_eq!(escape("i-1\n2026 INFO forged"), "i-1\\n2026 INFO forged");
        assert_eq!(escape("a\rb\u{1b}[2J\u{7f}"), "a\\rb\\u{1b}[2J\\u{7f}");
        assert_eq!(escape("plain é"), "plain é");
    }

    #[test]
    fn an_event_keeps_only_its_final_newline() {
        let e = escape_event(b"INFO joined instance=i-1\nINFO forged\n", false);
        assert_eq!(e, b"INFO joined instance=i-1\\nINFO forged\n");
        assert_eq!(escape_event(b"x\x1b[31m\n", false), b"x\\x1b[31m\n");
        assert_eq!(escape_event(b"x\x1b[31m\n", true), b"x\x1b[31m\n");
        assert_eq!(escape_event(b"no newline\r", false), b"no newline\\r");
    }
}
