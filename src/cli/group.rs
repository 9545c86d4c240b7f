//! `weir inspect --group` and `weir drop --group`: a worker group as its
//! PostgreSQL database holds it, whichever members run.

use std::io::{BufRead, IsTerminal, Write};

use weir::connectors::postgres;
use weir::group::{Coordinator, GroupStatus};
use weir::{Error, Owner, Result};

use super::target::{self, Database};
use super::EXIT_OK;

/// The PostgreSQL URL of `--into` for group `name`.
fn postgres_url(name: &str, into: &str) -> Result<String> {
    match Database::parse(into)? {
        Database::Postgres(url) => Ok(url),
        Database::Sqlite(_) => Err(Error::msg(format!(
            "worker group {name}: groups live in a PostgreSQL database; pass --into postgres://USER@HOST:PORT/DATABASE"
        ))),
    }
}

/// `weir inspect --group NAME --into URL`: the group's settings, its live
/// members with when their leases expire, and each partition's owner,
/// epoch and last completed pass.
pub async fn inspect(name: &str, into: &str) -> Result<u8> {
    let url = postgres_url(name, into)?;
    let coordinator = target::coordinator(&url).await?;
    let status = coordinator.status(name).await?;
    print!("{}", describe(&status));
    Ok(EXIT_OK)
}

/// The text `weir inspect --group` prints.
pub fn describe(status: &GroupStatus) -> String {
    let mut out = format!(
        "worker group {}: {} partitions, lease TTL {:.1}s\nmembers: {}\n",
        status.group,
        status.partitions,
        status.lease_ttl.as_secs_f64(),
        status.members.len()
    );
    for m in &status.members {
        let held = status
            .partition_states
            .iter()
            .filter(|p| p.owner.as_deref() == Some(m.member.as_str()))
            .count();
        out.push_str(&format!(
            "  {} on {}: {held} partition(s), lease expires in {:.1}s\n",
            m.member,
            m.host,
            m.expires_in.as_secs_f64()
        ));
    }
    out.push_str("partitions:\n");
    for p in &status.partition_states {
        let owner = p.owner.as_deref().unwrap_or("(none)");
        let pass = p
            .completed_pass
            .map_or_else(|| "never".to_string(), |n| n.to_string());
        out.push_str(&format!(
            "  {:>5}  owner {owner}, epoch {}, last completed pass {pass}\n",
            p.partition.to_string(),
            p.epoch
        ));
    }
    out
}

/// `weir drop --group NAME --into URL --yes`: removes the group: the
/// tables registered to it (and their rows), its leases, its changelog
/// and its registration. Refused while members are live: stop them first.
pub async fn drop(name: &str, into: &str, yes: bool) -> Result<u8> {
    let url = postgres_url(name, into)?;
    let coordinator = target::coordinator(&url).await?;
    let status = coordinator.status(name).await?;
    if !status.members.is_empty() {
        let live: Vec<&str> = status.members.iter().map(|m| m.member.as_str()).collect();
        return Err(Error::msg(format!(
            "worker group {name} has live members ({}): stop them first (their leases expire {:.1}s after they stop answering)",
            live.join(", "),
            status.lease_ttl.as_secs_f64()
        )));
    }
    if !yes && !confirmed(name)? {
        println!("nothing dropped");
        return Ok(EXIT_OK);
    }
    let pool = target::coordinator_pool(&url).await?;
    let tables = postgres::drop_tables_of(&pool, &Owner::group(name)).await?;
    coordinator.drop_group(name).await?;
    pool.close().await;
    let list = if tables.is_empty() {
        "no tables".to_string()
    } else {
        format!("tables {}", tables.join(", "))
    };
    println!(
        "dropped worker group {name} of {}: {list}, its leases and its changelog",
        Database::Postgres(url).display()
    );
    Ok(EXIT_OK)
}

/// Asks on the terminal; refuses without one.
fn confirmed(name: &str) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Err(Error::msg(
            "refusing to drop without confirmation: stdin is not a terminal; pass --yes",
        ));
    }
    print!("This deletes worker group {name}: its tables and their rows, its leases and its changelog. Type 'yes' to go on: ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == "yes")
}
