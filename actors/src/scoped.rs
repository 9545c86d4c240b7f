//! [`App::scoped`]: an App whose runs cover only the root-level
//! components of a [`RunScope`] (see [`scope`](crate::scope) for the rules).

use std::future::Future;

use crate::app::{App, Mode};
use crate::ctx::Ctx;
use crate::error::Result;
use crate::live::RunReport;
use crate::run::{PreviewAction, UpdateStats};
use crate::scope::RunScope;

/// An [`App`] whose runs cover only the root-level components of a
/// [`RunScope`] (see [`App::scoped`]).
#[derive(Debug)]
pub struct Scoped<'a> {
    app: &'a App,
    scope: RunScope,
}

impl App {
    /// This App, with runs restricted to the root-level components of
    /// `scope`: the others are neither run nor deleted (see the
    /// [module](crate::RunScope)'s rules).
    ///
    /// ```
    /// use weir_actors::{App, Result, RunScope};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<()> {
    /// let dir = tempfile::tempdir()?;
    /// let app = App::builder("docs").ledger_path(dir.path()).build().await?;
    /// let files = ["a.md", "b.md"];
    /// // Only b.md runs; a.md is neither run nor deleted.
    /// let stats = app
    ///     .scoped(RunScope::keys(["b.md"]))
    ///     .run(move |ctx| async move {
    ///         ctx.mount_each(files, |f| f.to_string(), |_ctx, _f| async { Ok(()) })
    ///             .await
    ///     })
    ///     .await?;
    /// assert_eq!(stats.components, 2); // the root and b.md
    /// # Ok(())
    /// # }
    /// ```
    pub fn scoped(&self, scope: RunScope) -> Scoped<'_> {
        Scoped { app: self, scope }
    }
}

impl Scoped<'_> {
    /// [`App::update`], within the scope.
    ///
    /// # Errors
    /// As [`App::update`].
    pub async fn update<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (value, _, _) = self.app.execute(f, Mode::Apply, scope).await?;
        Ok(value)
    }

    /// [`App::run`], within the scope.
    ///
    /// # Errors
    /// As [`App::run`].
    pub async fn run<F, Fut>(&self, f: F) -> Result<UpdateStats>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (_, stats, _) = self.app.execute(f, Mode::Apply, scope).await?;
        Ok(stats)
    }

    /// [`App::run_report`], within the scope.
    ///
    /// # Errors
    /// As [`App::run_report`].
    pub async fn run_report<F, Fut>(&self, f: F) -> Result<RunReport>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (stats, failures) = self.app.execute_collecting(f, scope).await?;
        Ok(RunReport { stats, failures })
    }

    /// [`App::preview`], within the scope.
    ///
    /// # Errors
    /// As [`App::preview`].
    pub async fn preview<F, Fut, T>(&self, f: F) -> Result<Vec<PreviewAction>>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (_, _, actions) = self.app.execute(f, Mode::Preview, scope).await?;
        Ok(actions)
    }
}
