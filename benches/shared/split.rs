//! Rows declared by one component, or split over many
//! (`WEIR_BENCH_COMPONENTS`), for the sync benchmarks.
//!
//! With one component (the default) nothing can be written before every
//! row has been declared and compared, because a component's actions are
//! applied only once its code has returned. Split over child components,
//! each child's rows are written as soon as it returns, while the others
//! still declare: the shape of a sync of many source files.

use std::sync::Arc;

use weir::prelude::*;

/// The number of components the rows are split into: `WEIR_BENCH_COMPONENTS`,
/// else 1.
pub fn components() -> usize {
    std::env::var("WEIR_BENCH_COMPONENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// Declares every row of `rows` into `target` with `declare`: from `ctx`
/// itself when `components` is 1, else from that many child components,
/// each with a contiguous range of ids (as each source file of a sync holds
/// its own rows). Ids run from 0 to the largest; a row stays with the same
/// child from one phase to the next as long as the largest id is declared.
pub async fn declare_rows<R, T, F>(
    ctx: &Ctx,
    rows: Arc<Vec<R>>,
    target: T,
    components: usize,
    id: fn(&R) -> u64,
    declare: F,
) -> Result<()>
where
    R: Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
    F: Fn(&T, &Ctx, &R) -> Result<()> + Copy + Send + Sync + 'static,
{
    if components <= 1 {
        for row in rows.iter() {
            declare(&target, ctx, row)?;
        }
        return Ok(());
    }
    let span = rows.iter().map(id).max().unwrap_or(0) + 1;
    let mut parts: Vec<Vec<usize>> = vec![Vec::new(); components];
    for (i, row) in rows.iter().enumerate() {
        let child = u128::from(id(row)) * components as u128 / u128::from(span);
        if let Some(part) = parts.get_mut(child as usize) {
            part.push(i);
        }
    }
    let parts: Vec<(usize, Vec<usize>)> = parts.into_iter().enumerate().collect();
    ctx.mount_each(
        parts,
        |(child, _)| *child as i64,
        move |ctx, (_, part)| {
            let (rows, target) = (Arc::clone(&rows), target.clone());
            async move {
                for row in part.iter().filter_map(|&i| rows.get(i)) {
                    declare(&target, &ctx, row)?;
                }
                Ok(())
            }
        },
    )
    .await
}
