//! `fenced status`: members, generations, owed fences, claims and arenas.

use std::process::ExitCode;

use clap::ValueEnum;

use super::OpError;
use crate::config::EtcdArgs;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
}

pub async fn status(args: StatusArgs) -> Result<ExitCode, OpError> {
    let store = super::connect(&args.etcd).await?;
    let s = store
        .status()
        .await
        .map_err(OpError::store("read the cluster status"))?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default()),
        Output::Text => {
            println!("members:       {}", fmt_pairs(&s.members));
            let gens: Vec<String> = s
                .generations
                .iter()
                .map(|(n, g)| format!("{n}={g}"))
                .collect();
            println!("generations:   {}", gens.join(" "));
            println!("owed fences:   {}", fmt_pairs(&s.owed));
            let done: Vec<String> = s.done.iter().map(|(n, g)| format!("{n}={g}")).collect();
            println!("fenced (done): {}", done.join(" "));
            println!("claims:        {}", fmt_pairs(&s.claims));
            println!("departed:      {}", s.departed.join(" "));
            println!("arenas:        {}", fmt_pairs(&s.arenas));
            println!("free arenas:   {}", s.free_arenas.join(" "));
            println!("audit records: {}", s.audit_records);
            // The shared namespace recorded by the first join (what every join and
            // NVMe fence compares its device with).
            let ns = store
                .namespace_record()
                .await
                .map_err(OpError::store("read the recorded namespace"))?;
            println!(
                "namespace:     {}",
                ns.map_or_else(|| "(none recorded)".to_owned(), |n| n.to_string())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn fmt_pairs(p: &[(String, String)]) -> String {
    p.iter()
        .map(|(a, b)| format!("{a}({b})"))
        .collect::<Vec<_>>()
        .join(" ")
}
