//! `weir drop`: delete everything weir created, and forget it.

use std::io::{BufRead, IsTerminal, Write};

use weir::{App, Error, Result};

use super::target::{self, Database};
use super::{DropArgs, EXIT_OK};

pub async fn run(args: DropArgs) -> Result<u8> {
    if let Some(name) = &args.group {
        return super::group::drop(name, &args.into.into, args.yes).await;
    }
    let db = Database::parse(&args.into.into)?;
    let ledger = &args.ledger.ledger;
    if !App::ledger_exists(ledger)? {
        return Err(Error::msg(format!(
            "no ledger at {}: nothing to drop (pass --ledger if it is elsewhere)",
            ledger.display()
        )));
    }
    let target = super::job::open_target(&db, ledger, &super::GroupArg::default(), false).await?;
    let report = target.app.inspect().await?;
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            return Err(Error::msg(
                "refusing to drop without confirmation: stdin is not a terminal; pass --yes",
            ));
        }
        print!(
            "This deletes the {} target states weir created in {} (its tables and their rows). Type 'yes' to go on: ",
            report.target_states,
            db.display()
        );
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if answer.trim() != "yes" {
            println!("nothing dropped");
            return Ok(EXIT_OK);
        }
    }
    let stats = super::job::drop_all(&target).await?;
    target::clear_marker(ledger)?;
    target.close().await;
    println!(
        "dropped what weir created in {} in {:.2}s: {} target states deleted (a table takes its rows with it)",
        db.display(),
        stats.elapsed.as_secs_f64(),
        stats.deleted,
    );
    Ok(EXIT_OK)
}
