//! `fenced generate` (hidden): the man pages and shell completions the package ships
//! (packaging/build-deb), rendered from the clap definitions that parse the command
//! line, so a flag, its env var and its help text cannot drift from the manual.

use std::path::{Path, PathBuf};

use clap_complete::Shell;

/// `fenced generate man DIR` / `fenced generate completions SHELL DIR`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Write fenced.1 and one page per command (fenced-run.1, fenced-status.1, ...)
    /// into DIR (created if missing).
    Man { dir: PathBuf },
    /// Write SHELL's completion script into DIR (created if missing): fenced.bash,
    /// _fenced (zsh), fenced.fish, ...
    Completions { shell: Shell, dir: PathBuf },
}

/// A file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the {what} into {}: {source}", dir.display())]
pub struct GenerateError {
    what: &'static str,
    dir: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Renders what `args` asks for from `cmd` (the whole `fenced` command).
pub fn generate(args: GenerateArgs, mut cmd: clap::Command) -> Result<(), GenerateError> {
    match args.what {
        What::Man { dir } => {
            let error = error_in("man pages", &dir);
            std::fs::create_dir_all(&dir).map_err(&error)?;
            clap_mangen::generate_to(cmd, &dir).map_err(error)
        }
        What::Completions { shell, dir } => {
            let error = error_in("completions", &dir);
            std::fs::create_dir_all(&dir).map_err(&error)?;
            let name = cmd.get_name().to_owned();
            clap_complete::generate_to(shell, &mut cmd, name, &dir)
                .map(drop)
                .map_err(error)
        }
    }
}

fn error_in(what: &'static str, dir: &Path) -> impl Fn(std::io::Error) -> GenerateError + use<> {
    let dir = dir.to_owned();
    move |source| GenerateError {
        what,
        dir: dir.clone(),
        source,
    }
}
