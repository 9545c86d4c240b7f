//! Registering providers and declaring target states.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::actors::component::{resolve_provider, Declaration};
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::model::path::TARGET_SYMBOL;
use crate::model::provider::{ChildGeneration, ProviderCore, ProviderPath};
use crate::model::typed::TypedHandler;
use crate::model::{StableKey, TargetHandler, TargetState, TargetStateProvider};

/// Registers a root provider named `name` with its handler, for this run.
///
/// Register it on every run, from a component: a run that does not
/// register a provider cannot reach its handler, so the states declared
/// through it are left in place. Registering the same name again in one
/// run returns the provider of the first registration.
///
/// # Errors
/// When `name` is empty, or already registered with another value type.
pub fn register_root_target_states_provider<V, H>(
    ctx: &Ctx,
    name: &str,
    handler: H,
) -> Result<TargetStateProvider<V>>
where
    V: Serialize + DeserializeOwned + Send + 'static,
    H: TargetHandler<V>,
{
    if name.is_empty() {
        return Err(Error::Usage("a provider name must not be empty".into()));
    }
    let run = &ctx.state.run;
    let path = ProviderPath::root(name);
    if let Some(existing) = run.provider(&path.enc) {
        TargetStateProvider::<V>::check_value_type(&existing)?;
        return Ok(TargetStateProvider::from_core(existing));
    }
    let core = Arc::new(ProviderCore::new(path, run.id));
    resolve_provider(
        run,
        &core,
        Arc::new(TypedHandler::<V, H>::new(handler)),
        ChildGeneration::default(),
    )?;
    // Two components may register the same name at once: use the winner.
    let core = run.provider(&core.path.enc).unwrap_or(core);
    TargetStateProvider::<V>::check_value_type(&core)?;
    Ok(TargetStateProvider::from_core(core))
}

fn declare<V>(ctx: &Ctx, state: TargetState<V>, child: Option<Arc<ProviderCore>>) -> Result<()> {
    let run = &ctx.state.run;
    let fail = |e: Error| {
        ctx.state.poison(&e);
        Err(e)
    };
    if state.provider.run_id != run.id {
        return fail(Error::Usage(format!(
            "provider {} belongs to another run; register it again in this run",
            state.provider.path.name
        )));
    }
    if run.dropping {
        return fail(Error::Usage(
            "App::drop_state declares nothing: register providers only".into(),
        ));
    }
    let value = match state.value {
        Ok(v) => v,
        Err(e) => {
            return fail(Error::Reconcile {
                provider: state.provider.path.name.to_string(),
                key: state.key,
                cause: Box::new(Error::permanent(format!("cannot serialize the value: {e}"))),
            })
        }
    };
    let path: Arc<[u8]> = Arc::from(state.provider.path.state_path(&state.key));
    ctx.state.declare(Declaration {
        path,
        key: state.key,
        provider: state.provider,
        value,
        child,
    })
}

/// Declares a target state in the current component.
///
/// # Errors
/// When the same state is declared twice in the component, the value could
/// not be serialized, or the provider comes from another run. The error
/// also fails the component.
pub fn declare_target_state<V>(ctx: &Ctx, state: TargetState<V>) -> Result<()>
where
    V: Serialize + DeserializeOwned + Send + 'static,
{
    declare(ctx, state, None)
}

/// Declares a container target state and returns the provider of its
/// children. The provider resolves when the component commits: children
/// declared through it in the same component are reconciled after the
/// container, and applied after it.
///
/// # Errors
/// As [`declare_target_state`].
pub fn declare_target_state_with_child<V, C>(
    ctx: &Ctx,
    state: TargetState<V>,
) -> Result<TargetStateProvider<C>>
where
    V: Serialize + DeserializeOwned + Send + 'static,
    C: Serialize + DeserializeOwned + Send + 'static,
{
    let core = Arc::new(ProviderCore::new(
        state.provider.path.child(&state.key),
        ctx.state.run.id,
    ));
    declare(ctx, state, Some(Arc::clone(&core)))?;
    Ok(TargetStateProvider::from_core(core))
}

/// Declares a container target state in a foreground child component,
/// commits it at once, and returns the provider of its children, ready to
/// use.
///
/// # Errors
/// When the child component fails, or the container's handler returned no
/// `Create`/`Update` action to build the child handler from.
pub async fn mount_target<V, C>(ctx: &Ctx, state: TargetState<V>) -> Result<TargetStateProvider<C>>
where
    V: Serialize + DeserializeOwned + Send + 'static,
    C: Serialize + DeserializeOwned + Send + 'static,
{
    let key = StableKey::Array(Arc::from(vec![
        StableKey::Symbol(Arc::from(TARGET_SYMBOL)),
        StableKey::Str(Arc::clone(&state.provider.path.name)),
        state.key.clone(),
    ]));
    let provider: TargetStateProvider<C> = ctx
        .mount_unscoped(key, move |c| async move {
            declare_target_state_with_child::<V, C>(&c, state)
        })
        .await?;
    if !provider.is_resolved() && !ctx.state.run.preview {
        return Err(Error::Usage(format!(
            "container {} was mounted but its handler returned no Create or Update action, so its children have no handler",
            provider.name()
        )));
    }
    Ok(provider)
}

impl<V> TargetStateProvider<V>
where
    V: Serialize + DeserializeOwned + Send + 'static,
{
    /// The provider of the attachment type `att_type` of this provider
    /// (registered eagerly from the handler's `attachments()`).
    ///
    /// # Errors
    /// When the provider is not resolved yet, has no such attachment type,
    /// or the attachment holds values of another type.
    pub fn attachment<W>(&self, ctx: &Ctx, att_type: &str) -> Result<TargetStateProvider<W>>
    where
        W: Serialize + DeserializeOwned + Send + 'static,
    {
        if self.core.run_id != ctx.state.run.id {
            return Err(Error::Usage(format!(
                "provider {} belongs to another run",
                self.core.path.name
            )));
        }
        let resolved = self.core.resolved.get().ok_or_else(|| {
            Error::Usage(format!(
                "provider {} is not resolved yet: its attachments are available once its container is committed (use mount_target)",
                self.core.path.name
            ))
        })?;
        let att = resolved.attachments.get(att_type).ok_or_else(|| {
            Error::Usage(format!(
                "provider {} has no attachment type {att_type:?}",
                self.core.path.name
            ))
        })?;
        TargetStateProvider::<W>::check_value_type(att)?;
        Ok(TargetStateProvider::from_core(Arc::clone(att)))
    }
}
