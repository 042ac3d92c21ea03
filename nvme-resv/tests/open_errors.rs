//! `Namespace::open` against real files and device nodes that are not NVMe
//! namespaces: the errors must be typed and say what is wrong. Runs anywhere.

use nvme_resv::{Error, Namespace};

#[test]
fn regular_file_is_not_nvme() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = Namespace::open(f.path()).expect_err("a temp file is not a namespace");
    assert!(
        matches!(&err, Error::NotNvme { path } if path == f.path()),
        "{err:?}"
    );
    assert!(err.to_string().contains("not an NVMe namespace"), "{err}");
    assert!(!err.is_reservation_conflict() && err.status().is_none());
}

#[test]
fn character_device_that_is_not_nvme() {
    let err = Namespace::open("/dev/null").expect_err("/dev/null is not a namespace");
    assert!(matches!(err, Error::NotNvme { .. }), "{err:?}");
}

#[test]
fn missing_path_is_an_open_error_with_the_os_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nvme9n9");
    let err = Namespace::open(&path).expect_err("no such node");
    match &err {
        Error::Open { path: p, source } => {
            assert_eq!(p, &path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn directory_is_not_a_namespace() {
    let dir = tempfile::tempdir().unwrap();
    // Opening a directory read-write fails with EISDIR: an open error, not a panic.
    let err = Namespace::open(dir.path()).expect_err("a directory");
    assert!(matches!(err, Error::Open { .. }), "{err:?}");
}
