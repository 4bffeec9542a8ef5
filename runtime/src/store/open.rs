//! Picking a store from a URL, for configuration files and the operator CLI.

use std::sync::Arc;

use super::{MemoryStore, Store, StoreError, StoreResult};

/// Opens the store a URL names:
///
/// | URL | store |
/// |---|---|
/// | `memory:` | [`MemoryStore`] (this process only) |
/// | `sqlite:PATH` or `sqlite://PATH` | `SqliteStore` (feature `sqlite`) |
/// | `redis://…`, `rediss://…` | `RedisStore` (feature `redis`); `?allow_without_persistence=true` accepts a server with `appendonly no` |
/// | `postgres://…`, `postgresql://…` | `PostgresStore` (feature `postgres`) |
///
/// A scheme whose feature was not compiled in is a clear error naming the feature.
pub async fn open(url: &str) -> StoreResult<Arc<dyn Store>> {
    let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        "sqlite" => open_sqlite(rest.strip_prefix("//").unwrap_or(rest)).await,
        "redis" | "rediss" => open_redis(url).await,
        "postgres" | "postgresql" => open_postgres(url).await,
        _ => Err(StoreError::unavailable_message(format!(
            "unknown store URL {url:?}: use memory:, sqlite:PATH, redis://HOST:PORT or postgres://USER@HOST/DB"
        ))),
    }
}

#[cfg(not(all(feature = "sqlite", feature = "redis", feature = "postgres")))]
fn missing(feature: &str) -> StoreError {
    StoreError::unavailable_message(format!(
        "this build has no {feature} store: enable the `{feature}` feature of tool-contracts"
    ))
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &str) -> StoreResult<Arc<dyn Store>> {
    if path.is_empty() {
        return Err(StoreError::unavailable_message(
            "sqlite: URL without a path: write sqlite:/var/lib/app/keys.db",
        ));
    }
    Ok(Arc::new(super::SqliteStore::open(path).await?))
}
#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_: &str) -> StoreResult<Arc<dyn Store>> {
    Err(missing("sqlite"))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str) -> StoreResult<Arc<dyn Store>> {
    Ok(Arc::new(super::RedisStore::connect(url).await?))
}
#[cfg(not(feature = "redis"))]
async fn open_redis(_: &str) -> StoreResult<Arc<dyn Store>> {
    Err(missing("redis"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> StoreResult<Arc<dyn Store>> {
    Ok(Arc::new(super::PostgresStore::connect(url).await?))
}
#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &str) -> StoreResult<Arc<dyn Store>> {
    Err(missing("postgres"))
}
