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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(flatten)]
        args: GenerateArgs,
    }

    fn args(words: &[&str]) -> GenerateArgs {
        Top::try_parse_from(std::iter::once("generate").chain(words.iter().copied()))
            .unwrap()
            .args
    }

    fn command() -> clap::Command {
        clap::Command::new("fenced")
            .version("1.2.3")
            .subcommand(
                clap::Command::new("run").arg(
                    clap::Arg::new("node_id")
                        .long("node-id")
                        .env("FENCED_NODE_ID")
                        .help("This node's id"),
                ),
            )
            .subcommand(clap::Command::new("secret").hide(true))
    }

    #[test]
    fn man_pages_per_visible_command_with_env_vars() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new/man");
        let d = out.to_str().unwrap();
        generate(args(&["man", d]), command()).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["fenced-run.1", "fenced.1"],
            "hidden commands get no page"
        );
        let run = std::fs::read_to_string(out.join("fenced-run.1")).unwrap();
        assert!(
            run.contains("FENCED_NODE_ID") && run.contains("This node\\*(Aqs id"),
            "{run}"
        );
    }

    #[test]
    fn completions_and_errors_naming_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        generate(args(&["completions", "bash", d]), command()).unwrap();
        let bash = std::fs::read_to_string(dir.path().join("fenced.bash")).unwrap();
        assert!(bash.contains("--node-id"), "{bash}");
        let file = dir.path().join("fenced.bash");
        let f = file.to_str().unwrap();
        let e = generate(args(&["man", f]), command()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("cannot write the man pages into {f}: ")),
            "{e}"
        );
    }
}
