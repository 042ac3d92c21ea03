//! `fence_nvme`: see the crate documentation and README.md.

use std::io::Write;
use std::path::Path;

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let name = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("fence_nvme")
        .to_owned();
    let out = fence_nvme::main_with(
        &name,
        &argv[1.min(argv.len())..],
        &mut std::io::stdin().lock(),
        &fence_nvme::real_devices(),
    );
    for l in &out.stderr {
        eprintln!("{l}");
    }
    let mut so = std::io::stdout().lock();
    for l in &out.stdout {
        let _ = writeln!(so, "{l}");
    }
    let _ = so.flush();
    std::process::exit(out.code);
}
