//! Ctrl-C and SIGTERM: a sync asked to stop lets what runs commit, then
//! exits.

use weir::ShutdownHandle;

use super::EXIT_INTERRUPTED;

/// Requests a shutdown on Ctrl-C or SIGTERM.
pub(super) async fn stop_on_signal(shutdown: ShutdownHandle) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return request(&shutdown);
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    request(&shutdown);
}

fn request(shutdown: &ShutdownHandle) {
    tracing::info!(
        "stopping: files being synced finish, the rest wait for the next sync (Ctrl-C again to quit at once)"
    );
    shutdown.shutdown();
    // A second request quits at once: what committed stays committed, and
    // the ledger's intents cover what was being applied.
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("interrupted again: quitting now");
            std::process::exit(i32::from(EXIT_INTERRUPTED));
        }
    });
}
