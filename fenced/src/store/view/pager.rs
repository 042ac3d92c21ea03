//! The paged read of the key space (I/O only): one transaction of range reads per
//! page, every page after the first pinned to the first one's revision, a page sized
//! from what the earlier pages measured, read again smaller when the answer is too
//! large, and the whole read started again at the newest revision when compaction
//! cuts it. What the records mean is the parent module's decoder.

use std::future::Future;

use etcd_client::{Client, GetOptions, KeyValue, KvClient, Txn, TxnOp, TxnOpResponse};

use super::{KeySpace, Scope, escaped_key};
use crate::keys::Keys;
use crate::store::{EtcdStore, Result, StoreError, StoreOptions};

/// What a range of the read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Keys and values.
    Values,
    /// Keys only: the records whose value no view reads.
    Keys,
    /// Only the number of keys (read with the first page).
    Count,
}

/// One prefix range of the read, with a guess of its bytes per record as decoded
/// (key, value, revisions, framing) that sizes the first page. Later pages use what
/// the earlier ones measured.
#[derive(Debug, Clone)]
struct Span {
    prefix: String,
    want: Want,
    guess: usize,
}

/// Bytes per record the first page assumes: a node record (`gen/`, `membership/`,
/// ...: a key naming a node, a short value, revisions and a lease)...
const NODE_RECORD_GUESS: usize = 80;
/// ...an arena record (a key naming a node and an arena, or an arena and its owner)...
const ARENA_RECORD_GUESS: usize = 120;
/// ...a liveness stamp (a small JSON object)...
const LIVENESS_GUESS: usize = 160;
/// ...and an audit record (JSON with the fence's steps; at most 64 KiB, usually under 1).
const AUDIT_GUESS: usize = 1024;

/// How many times a read cut by compaction is started again at the newest revision.
pub(super) const READ_ATTEMPTS: u32 = 3;

/// The ranges of the read, in the order [`KeySpace`] takes them.
fn spans(k: &Keys, scope: Scope) -> Vec<Span> {
    let span = |prefix, want, guess| Span {
        prefix,
        want,
        guess,
    };
    let mut v = vec![
        span(k.generation_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.pending_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.done_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.membership_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.departed_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.arena_node_all_prefix(), Want::Keys, ARENA_RECORD_GUESS),
        span(k.claim_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.instance_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.arena_claim_prefix(), Want::Keys, ARENA_RECORD_GUESS),
        span(k.arena_pool_prefix(), Want::Keys, ARENA_RECORD_GUESS),
        span(k.audit_prefix(), Want::Count, 0),
    ];
    if scope == Scope::Status {
        v.push(span(k.liveness_prefix(), Want::Values, LIVENESS_GUESS));
        v.push(span(k.audit_prefix(), Want::Values, AUDIT_GUESS));
        // The arena layout before per-node claims (listed, never used).
        v.push(span(
            k.legacy_arena_owner_prefix(),
            Want::Values,
            ARENA_RECORD_GUESS,
        ));
        v.push(span(
            k.legacy_arena_free_prefix(),
            Want::Keys,
            ARENA_RECORD_GUESS,
        ));
    }
    v
}

/// The paged read's KV client (answers up to
/// [`StoreOptions::read_max_response_bytes`]) and its page size.
#[derive(Clone)]
pub(in crate::store) struct Reader {
    kv: KvClient,
    page_bytes: usize,
    max_response_bytes: usize,
}

impl Reader {
    pub(in crate::store) fn new(client: &Client, opts: &StoreOptions) -> Self {
        Self {
            kv: client
                .kv_client()
                .max_decoding_message_size(opts.read_max_response_bytes),
            page_bytes: opts.read_page_bytes.max(1),
            max_response_bytes: opts.read_max_response_bytes,
        }
    }
}

/// The first key after every key that starts with `prefix` (etcd's prefix range end).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // Every key starts with the empty prefix: etcd reads `\0` as "to the end".
    vec![0]
}

/// Bytes of a protobuf varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes `kv` takes in a range answer: the `KeyValue` message and its framing (the
/// size etcd-client's answer limit counts). Public for the benches, which size the
/// answers they measure by it.
pub fn encoded_len(kv: &KeyValue) -> usize {
    let bytes = |n: usize| match n {
        0 => 0,
        n => 1 + varint_len(n as u64) + n,
    };
    // Negative numbers (none expected) take 10 bytes, as `v as u64` does.
    let int = |v: i64| match v {
        0 => 0,
        v => 1 + varint_len(v as u64),
    };
    let body = bytes(kv.key().len())
        + bytes(kv.value().len())
        + int(kv.create_revision())
        + int(kv.mod_revision())
        + int(kv.version())
        + int(kv.lease());
    1 + varint_len(body as u64) + body
}

/// Where one span of the read stands.
#[derive(Default)]
struct Cursor {
    /// The key the next page starts at (`None`: the span's prefix).
    resume: Option<Vec<u8>>,
    done: bool,
    /// Records read so far, and the bytes they took, which size the next pages.
    records: usize,
    bytes: usize,
}

/// The spans as read at one revision.
struct Paged {
    revision: i64,
    /// Per span: the key-value pairs in key order ([`Want::Count`]: none).
    kvs: Vec<Vec<KeyValue>>,
    /// Per span: the number of keys ([`Want::Count`] only).
    counts: Vec<usize>,
}

/// How far a read got (for the error when compaction keeps cutting it).
#[derive(Default, Clone, Copy)]
struct Progress {
    revision: i64,
    pages: u32,
}

/// A page came back larger than the client accepts.
fn too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large"))
}

/// A store error whose cause is our own explanation (`code`: how it classifies).
fn explained(code: tonic::Code, why: String) -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::new(code, why))
}

impl EtcdStore {
    /// Reads everything the sweep and `fenced status` look at, at one revision, in
    /// pages (`op` names it in errors).
    pub(super) async fn key_space(&self, op: &'static str, scope: Scope) -> Result<KeySpace> {
        self.key_space_with(op, scope, |_, _| async {}).await
    }

    /// [`Self::key_space`], running `between(pages_read, revision)` before each page
    /// after the first (the tests write and compact there).
    pub(super) async fn key_space_with<F, Fut>(
        &self,
        op: &'static str,
        scope: Scope,
        between: F,
    ) -> Result<KeySpace>
    where
        F: FnMut(u32, i64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let spans = spans(&self.keys, scope);
        let read = self.read_spans(op, &spans, between).await?;
        let audit_records = read.counts.get(10).copied().unwrap_or(0);
        let mut ranges = read.kvs.into_iter();
        let mut next = || ranges.next().unwrap_or_default();
        let (generations, pending, done, members, departed) =
            (next(), next(), next(), next(), next());
        let (arena_nodes, claims, instances, arena_claims, arena_pool) =
            (next(), next(), next(), next(), next());
        let _audit_count = next();
        Ok(KeySpace {
            revision: read.revision,
            generations,
            pending,
            done,
            members,
            departed,
            arena_nodes,
            claims,
            instances,
            arena_claims,
            arena_pool,
            audit_records,
            liveness: next(),
            audits: next(),
            legacy_arenas: [next(), next()].concat(),
        })
    }

    /// Reads `spans` at one revision, starting again at the newest revision when
    /// compaction removes the one being read before the last page (at most
    /// [`READ_ATTEMPTS`] times).
    async fn read_spans<F, Fut>(
        &self,
        op: &'static str,
        spans: &[Span],
        mut between: F,
    ) -> Result<Paged>
    where
        F: FnMut(u32, i64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut cause = None;
        let mut progress = Progress::default();
        for attempt in 1..=READ_ATTEMPTS {
            progress = Progress::default();
            match self
                .read_pages(op, spans, &mut between, &mut progress)
                .await
            {
                Err(StoreError::Compacted { source, .. }) => {
                    tracing::info!(
                        step = op,
                        attempt,
                        revision = progress.revision,
                        pages = progress.pages,
                        cause = %source,
                        "the revision of a paged read was compacted before its last page; reading again at the newest revision"
                    );
                    cause = Some(source);
                }
                other => return other,
            }
        }
        let cause = cause.map_or_else(String::new, |c| c.to_string());
        Err(StoreError::Compacted {
            op,
            source: explained(
                tonic::Code::OutOfRange,
                format!(
                    "the key space is read in pages at one revision, and etcd compacted that revision before the last page on each of {READ_ATTEMPTS} attempts (the last at revision {}, after {} pages): compaction runs more often than one read takes; keep more history (etcd --auto-compaction-retention) or raise read_page_bytes so the read takes fewer pages (last cause: {cause})",
                    progress.revision, progress.pages
                ),
            ),
        })
    }

    /// One attempt of [`Self::read_spans`].
    async fn read_pages<F, Fut>(
        &self,
        op: &'static str,
        spans: &[Span],
        between: &mut F,
        progress: &mut Progress,
    ) -> Result<Paged>
    where
        F: FnMut(u32, i64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut cursors: Vec<Cursor> = spans.iter().map(|_| Cursor::default()).collect();
        let mut out = Paged {
            revision: 0,
            kvs: spans.iter().map(|_| Vec::new()).collect(),
            counts: vec![0; spans.len()],
        };
        // What a page may hold; both shrink when a page comes back too large.
        let mut budget = self.reader.page_bytes;
        let mut width = spans.len();
        loop {
            let open: Vec<usize> = (0..spans.len())
                .filter(|&i| !cursors[i].done)
                .take(width)
                .collect();
            if open.is_empty() {
                return Ok(out);
            }
            if progress.pages > 0 {
                between(progress.pages, out.revision).await;
            }
            let listing = open
                .iter()
                .filter(|&&i| spans[i].want != Want::Count)
                .count()
                .max(1);
            let mut ops = Vec::with_capacity(open.len());
            let mut limits = Vec::with_capacity(open.len());
            for &i in &open {
                let (span, cursor) = (&spans[i], &cursors[i]);
                let per_record = match cursor.records {
                    0 => span.guess,
                    n => cursor.bytes.div_ceil(n),
                }
                .max(1);
                let limit = (budget / listing / per_record).max(1);
                let mut o = GetOptions::new()
                    .with_range(prefix_end(span.prefix.as_bytes()))
                    .with_revision(out.revision);
                o = match span.want {
                    Want::Count => o.with_count_only(),
                    Want::Keys => o.with_keys_only().with_limit(limit as i64),
                    Want::Values => o.with_limit(limit as i64),
                };
                limits.push(if span.want == Want::Count { 0 } else { limit });
                let start = cursor
                    .resume
                    .clone()
                    .unwrap_or_else(|| span.prefix.as_bytes().to_vec());
                ops.push(TxnOp::get(start, Some(o)));
            }
            self.rt();
            let answer = self.reader.kv.clone().txn(Txn::new().and_then(ops)).await;
            let resp = match answer {
                Ok(r) => r,
                Err(e) if too_large(&e) => {
                    if limits.iter().any(|&l| l > 1) {
                        budget = (budget / 2).max(1);
                    } else if open.len() > 1 {
                        width = (open.len() / 2).max(1);
                    } else {
                        let span = &spans[open[0]];
                        let after = cursors[open[0]]
                            .resume
                            .as_deref()
                            .map_or_else(|| "its first key".to_owned(), escaped_key);
                        return Err(StoreError::Other {
                            op,
                            source: explained(
                                tonic::Code::OutOfRange,
                                format!(
                                    "one record under {} (at or after {after}) is larger than the read accepts ({} bytes; etcd-client: {e}): raise read_max_response_bytes, or repair or delete the record",
                                    escaped_key(span.prefix.as_bytes()),
                                    self.reader.max_response_bytes
                                ),
                            ),
                        });
                    }
                    tracing::debug!(
                        step = op,
                        budget,
                        width,
                        "a page of the read came back too large; reading it again smaller"
                    );
                    continue;
                }
                Err(e) => return Err(StoreError::classify(op, e)),
            };
            if out.revision == 0 {
                out.revision = resp.header().map_or(0, |h| h.revision());
            }
            let answers = resp.op_responses();
            if answers.len() != open.len() {
                return Err(StoreError::Other {
                    op,
                    source: explained(
                        tonic::Code::Internal,
                        format!(
                            "etcd answered {} of the {} range reads of a page",
                            answers.len(),
                            open.len()
                        ),
                    ),
                });
            }
            for (answer, &i) in answers.into_iter().zip(&open) {
                let TxnOpResponse::Get(mut g) = answer else {
                    return Err(StoreError::Other {
                        op,
                        source: explained(
                            tonic::Code::Internal,
                            "etcd answered a range read with something else".to_owned(),
                        ),
                    });
                };
                let cursor = &mut cursors[i];
                if spans[i].want == Want::Count {
                    out.counts[i] = usize::try_from(g.count()).unwrap_or(usize::MAX);
                    cursor.done = true;
                    continue;
                }
                let kvs = g.take_kvs();
                cursor.records += kvs.len();
                cursor.bytes += kvs.iter().map(encoded_len).sum::<usize>();
                match (g.more(), kvs.last()) {
                    (false, _) => cursor.done = true,
                    (true, Some(last)) => {
                        let mut resume = last.key().to_vec();
                        resume.push(0);
                        cursor.resume = Some(resume);
                    }
                    (true, None) => {
                        return Err(StoreError::Other {
                            op,
                            source: explained(
                                tonic::Code::Internal,
                                format!(
                                    "etcd said more records follow under {} but sent none",
                                    escaped_key(spans[i].prefix.as_bytes())
                                ),
                            ),
                        });
                    }
                }
                out.kvs[i].extend(kvs);
            }
            progress.revision = out.revision;
            progress.pages += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_and_record_sizes() {
        assert_eq!(prefix_end(b"/f/gen/"), b"/f/gen0".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(
            [0, 1, 127, 128, 16_383, 16_384, u64::MAX].map(varint_len),
            [1, 1, 1, 2, 2, 3, 10]
        );
    }
}
