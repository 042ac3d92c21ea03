//! Requests the writer must refuse before submission, engine selection (forced sync
//! engine, io_uring disabled by a seccomp filter), and a closed writer.

mod common;

use blockio::{AlignedBuf, DirectWriter, EngineKind, Error, Options};

const SIZE: u64 = 1 << 20;

fn setup(engine: EngineKind) -> (tempfile::TempDir, std::path::PathBuf, DirectWriter) {
    let dir = common::test_dir();
    let path = common::zero_file(dir.path(), "dev.img", SIZE);
    let w =
        DirectWriter::open(&path, Options::default().engine(engine).queue_depth(2)).expect("open");
    (dir, path, w)
}

fn for_both(f: impl Fn(EngineKind)) {
    f(EngineKind::IoUring);
    f(EngineKind::Sync);
}

#[test]
fn misaligned_requests_are_refused_before_submission() {
    for_both(|engine| {
        let (_d, path, mut w) = setup(engine);
        let a = w.offset_alignment();
        let buf = AlignedBuf::from_slice(&vec![0xee; 2 * a], w.alignment()).unwrap();
        let before = w.requests_submitted();

        let e = w
            .write_at(&buf, (a / 2) as u64)
            .expect_err("misaligned offset");
        assert!(
            matches!(e, Error::MisalignedOffset { offset, align } if offset == (a / 2) as u64 && align == a),
            "{e:?}"
        );
        assert!(e.is_misaligned());

        let odd = AlignedBuf::zeroed(a + a / 2, w.alignment()).unwrap();
        let e = w.write_at(&odd, 0).expect_err("misaligned length");
        assert!(
            matches!(e, Error::MisalignedLength { len, .. } if len == a + a / 2),
            "{e:?}"
        );
        let mut odd = odd;
        let e = w.read_at(&mut odd, 0).expect_err("misaligned read length");
        assert!(e.is_misaligned(), "{e:?}");

        let m = w.memory_alignment();
        if m > 8 {
            // Find a buffer whose address is 8-aligned but not m-aligned.
            let mut keep = Vec::new();
            let bad = loop {
                let b = AlignedBuf::zeroed(2 * a, 8).unwrap();
                if b.as_ptr() as usize % m != 0 {
                    break b;
                }
                keep.push(b);
                assert!(
                    keep.len() < 1000,
                    "allocator only returns {m}-aligned memory"
                );
            };
            let e = w.write_at(&bad, 0).expect_err("misaligned buffer");
            assert!(
                matches!(e, Error::MisalignedBuffer { align, .. } if align == m),
                "{e:?}"
            );
            let r = w
                .submit_write(bad, 0, 1)
                .expect_err("misaligned buffer, queued");
            assert!(r.error.is_misaligned());
        } else {
            eprintln!(
                "memory alignment is {m}: every AlignedBuf satisfies it; buffer check not exercised"
            );
        }

        assert_eq!(
            w.requests_submitted(),
            before,
            "{engine}: a refused request reached the kernel"
        );
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));
        assert!(!w.is_fenced());
    });
}

#[test]
fn requests_past_the_end_are_refused() {
    for_both(|engine| {
        let (_d, _p, mut w) = setup(engine);
        assert_eq!(w.size(), SIZE);
        let a = w.alignment();
        let buf = AlignedBuf::zeroed(2 * a, a).unwrap();
        // The last two blocks are fine; one more block is past the end.
        w.write_at(&buf, SIZE - 2 * a as u64)
            .expect("write ending at the end");
        let e = w.write_at(&buf, SIZE - a as u64).expect_err("past the end");
        assert!(
            matches!(e, Error::OutOfBounds { offset, len, size } if offset == SIZE - a as u64 && len == 2 * a && size == SIZE),
            "{e:?}"
        );
        let e = w
            .write_at(&buf, u64::MAX - (a as u64 - 1))
            .expect_err("overflowing offset");
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e:?}");
        let mut rb = AlignedBuf::zeroed(2 * a, a).unwrap();
        let e = w.read_at(&mut rb, SIZE).expect_err("read past the end");
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e:?}");
        // The file was not extended.
        assert_eq!(std::fs::metadata(w.path()).unwrap().len(), SIZE);
    });
}

#[test]
fn queue_depth_is_enforced_and_rejections_hand_the_buffer_back() {
    for_both(|engine| {
        let (_d, _p, mut w) = setup(engine);
        let a = w.alignment();
        for i in 0..2u64 {
            w.submit_write(AlignedBuf::zeroed(a, a).unwrap(), i * a as u64, i)
                .expect("within queue depth");
        }
        assert_eq!(w.in_flight(), 2);
        let mut third = AlignedBuf::zeroed(a, a).unwrap();
        third.as_mut_slice()[0] = 42;
        let r = w.submit_write(third, 0, 3).expect_err("queue full");
        assert!(
            matches!(r.error, Error::QueueFull { queue_depth: 2 }),
            "{:?}",
            r.error
        );
        assert!(r.error.is_retryable());
        assert_eq!(r.buf.as_slice()[0], 42);
        let mut out = Vec::new();
        while out.len() < 2 {
            w.reap(1, &mut out).expect("reap");
        }
        assert_eq!(w.in_flight(), 0);
        w.submit_write(r.buf, 0, 3).expect("room again");
        w.wait_all(&mut out).expect("wait");
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|c| c.result.is_ok()));
    });
}

#[test]
fn a_closed_writer_refuses_requests() {
    for_both(|engine| {
        let (_d, _p, mut w) = setup(engine);
        let a = w.alignment();
        let buf = AlignedBuf::zeroed(a, a).unwrap();
        w.submit_write(buf.clone(), 0, 1).expect("submit");
        w.close().expect("close drains");
        let mut out = Vec::new();
        w.reap(0, &mut out).expect("completions survive close");
        assert_eq!(out.len(), 1);
        out[0].result.as_ref().expect("write before close");
        assert!(matches!(w.write_at(&buf, 0), Err(Error::Closed)));
        let mut rb = buf.clone();
        assert!(matches!(w.read_at(&mut rb, 0), Err(Error::Closed)));
        assert!(matches!(w.submit_write(buf, 0, 2), Err(r) if matches!(r.error, Error::Closed)));
        assert!(matches!(w.flush(), Err(Error::Closed)));
    });
}

#[test]
fn opening_refuses_what_cannot_do_direct_io() {
    let dir = common::test_dir();
    let e =
        DirectWriter::open(dir.path().join("missing"), Options::default()).expect_err("missing");
    assert!(matches!(e, Error::Open { .. }), "{e:?}");
    let e = DirectWriter::open(dir.path(), Options::default()).expect_err("a directory");
    assert!(
        matches!(e, Error::Open { .. } | Error::NotBlockOrFile { .. }),
        "{e:?}"
    );
    let e = DirectWriter::open("/dev/null", Options::default()).expect_err("a char device");
    assert!(
        matches!(
            e,
            Error::NotBlockOrFile { .. } | Error::DirectIoUnsupported { .. }
        ),
        "{e:?}"
    );
}

#[test]
fn forced_sync_engine_is_reported_and_works() {
    let (_d, path, mut w) = setup(EngineKind::Sync);
    assert_eq!(w.engine(), EngineKind::Sync);
    assert!(
        w.fallback_reason().is_none(),
        "sync was asked for, not a fallback"
    );
    assert!(!w.uses_fixed_file());
    let a = w.alignment();
    let data = AlignedBuf::from_slice(&vec![0x3c; 4 * a], a).unwrap();
    let syscalls = w.requests_submitted();
    w.write_at(&data, a as u64).expect("write");
    assert_eq!(w.requests_submitted(), syscalls + 1, "one pwrite");
    w.flush().expect("flush");
    assert_eq!(&std::fs::read(path).unwrap()[a..5 * a], data.as_slice());
}

#[test]
fn dsync_writes_land() {
    for_both(|engine| {
        let dir = common::test_dir();
        let path = common::zero_file(dir.path(), "dev.img", SIZE);
        let mut w =
            DirectWriter::open(&path, Options::default().engine(engine).dsync(true)).expect("open");
        let a = w.alignment();
        let data = AlignedBuf::from_slice(&vec![0x81; 2 * a], a).unwrap();
        w.write_at(&data, 0).expect("dsync write");
        assert_eq!(&std::fs::read(&path).unwrap()[..2 * a], data.as_slice());
    });
}

/// Installs, on the calling thread only, a seccomp filter that fails
/// `io_uring_setup(2)` with `ENOSYS`, as container runtimes' default profiles do.
fn deny_io_uring_on_this_thread() {
    // Classic BPF opcodes from <linux/filter.h>.
    const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const BPF_JMP_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let nr = libc::SYS_io_uring_setup as u32;
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: BPF_JMP_JEQ_K,
            jt: 0,
            jf: 1,
            k: nr,
        },
        libc::sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        libc::sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(
        r,
        0,
        "PR_SET_NO_NEW_PRIVS: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `prog` points to `filter`, both live for the call; the kernel copies the
    // program. Without SECCOMP_FILTER_FLAG_TSYNC it applies to this thread only.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    assert_eq!(r, 0, "PR_SET_SECCOMP: {}", std::io::Error::last_os_error());
}

#[test]
fn auto_falls_back_to_sync_when_seccomp_denies_io_uring() {
    let dir = common::test_dir();
    let path = common::zero_file(dir.path(), "dev.img", SIZE);

    // Without the filter, Auto picks io_uring here.
    let w = DirectWriter::open(&path, Options::default()).expect("open");
    assert_eq!(
        w.engine(),
        EngineKind::IoUring,
        "io_uring works on this machine"
    );
    drop(w);

    let p = path.clone();
    std::thread::spawn(move || {
        deny_io_uring_on_this_thread();
        let mut w = DirectWriter::open(&p, Options::default()).expect("Auto must fall back");
        assert_eq!(w.engine(), EngineKind::Sync);
        let reason = w.fallback_reason().expect("the fallback is reported");
        assert!(reason.is_uring_unavailable(), "{reason:?}");
        assert!(
            matches!(reason, Error::Ring { call: "setup", source } if source.raw_os_error() == Some(libc::ENOSYS)),
            "{reason:?}"
        );
        let a = w.alignment();
        let data = AlignedBuf::from_slice(&vec![0x6d; a], a).unwrap();
        w.write_at(&data, 0).expect("sync engine writes");

        let e = DirectWriter::open(&p, Options::default().engine(EngineKind::IoUring))
            .expect_err("io_uring was asked for explicitly");
        assert!(e.is_uring_unavailable(), "{e:?}");
    })
    .join()
    .expect("seccomp thread");
    assert_eq!(&std::fs::read(&path).unwrap()[..512], &[0x6d; 512][..]);
}

#[test]
fn single_issuer_ring_delivers_completions_to_nonblocking_reaps() {
    let dir = common::test_dir();
    let path = common::zero_file(dir.path(), "dev.img", SIZE);
    let mut w = DirectWriter::open(
        &path,
        Options::default()
            .engine(EngineKind::IoUring)
            .single_issuer(true)
            .queue_depth(8),
    )
    .expect("open");
    let a = w.alignment();
    for i in 0..8u64 {
        let buf = AlignedBuf::from_slice(&vec![i as u8 + 1; a], a).unwrap();
        w.submit_write(buf, i * a as u64, i).expect("submit");
    }
    // With deferred task work, completions appear only when the issuer asks for
    // events: reap(0) must do so, or this loop never ends.
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    while out.len() < 8 {
        w.reap(0, &mut out).expect("reap(0)");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "non-blocking reaps saw {} of 8 completions",
            out.len()
        );
    }
    assert!(out.iter().all(|c| c.result.is_ok()));
    let data = std::fs::read(&path).unwrap();
    for i in 0..8 {
        assert!(data[i * a..(i + 1) * a].iter().all(|&b| b == i as u8 + 1));
    }
}

#[test]
fn files_without_statx_dio_alignment_use_the_block_size() {
    // tmpfs accepts O_DIRECT (Linux >= 6.6) but reports no STATX_DIOALIGN.
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("SKIPPED: no /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in(shm).expect("temp dir on /dev/shm");
    let path = common::zero_file(dir.path(), "dev.img", SIZE);
    let mut w = match DirectWriter::open(&path, Options::default()) {
        Ok(w) => w,
        Err(Error::DirectIoUnsupported { .. }) => {
            eprintln!("SKIPPED: /dev/shm refuses O_DIRECT on this kernel");
            return;
        }
        Err(e) => panic!("open on /dev/shm: {e:?}"),
    };
    use std::os::unix::fs::MetadataExt;
    let bs = std::fs::metadata(&path).unwrap().blksize() as usize;
    assert!(
        w.alignment() >= 512 && w.alignment() <= bs,
        "{} vs {bs}",
        w.alignment()
    );
    let data = AlignedBuf::from_slice(&vec![0x42; w.alignment()], w.alignment()).unwrap();
    w.write_at(&data, w.alignment() as u64).expect("write");
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[w.alignment()..2 * w.alignment()], data.as_slice());
}
