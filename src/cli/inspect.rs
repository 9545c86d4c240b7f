//! `weir inspect`: what the ledger tracks.

use weir::{App, Error, Result};

use super::target::tracked_database;
use super::{InspectArgs, EXIT_OK};

pub async fn run(args: InspectArgs) -> Result<u8> {
    if let Some(name) = &args.group {
        return super::group::inspect(name, &args.into.into).await;
    }
    let ledger = &args.ledger.ledger;
    // `inspect` and `drop` must not create a ledger where there is none.
    if !App::ledger_exists(ledger)? {
        return Err(Error::msg(format!(
            "no ledger at {}: run `weir sync DIR` first, or pass --ledger",
            ledger.display()
        )));
    }
    let app = App::builder("weir").ledger_path(ledger).build().await?;
    if args.failed {
        return list_failed(&app).await;
    }
    let report = app.inspect().await?;
    println!(
        "ledger {} (format version {}, {})",
        report.path,
        report.format_version,
        human_bytes(report.size_on_disk)
    );
    if let Some(db) = tracked_database(ledger) {
        println!("database: {db}");
    }
    println!("components: {}", report.components);
    println!("target states: {}", report.target_states);
    let width = report
        .providers
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0);
    for (name, count) in &report.providers {
        println!("  {name:<width$}  {count}");
    }
    println!("failed components: {}", report.failures.len());
    for (path, cause) in &report.failures {
        println!("  {}: {cause}", path.to_string().trim_start_matches('/'));
    }
    Ok(EXIT_OK)
}

/// `weir inspect --failed`: one line per failed file (the path, how many
/// syncs in a row it failed, the cause), or a line saying none failed.
async fn list_failed(app: &App) -> Result<u8> {
    let failed = app.failed_components().await?;
    if failed.is_empty() {
        println!("no failed files");
    }
    for f in failed {
        let path = f.path.to_string();
        let what = match path.trim_start_matches('/') {
            "" => "(the sync as a whole)",
            file => file,
        };
        let quarantined = if f.quarantined { ", quarantined" } else { "" };
        println!(
            "{what}: failed {} sync(s) in a row{quarantined}: {}",
            f.failed_runs, f.cause
        );
    }
    Ok(EXIT_OK)
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
