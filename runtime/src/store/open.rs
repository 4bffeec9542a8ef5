//! Picking a store from a URL, for configuration files and the operator CLI.

use std::sync::Arc;
use std::time::Duration;

use super::{MemoryStore, NearCache, Store, StoreError, StoreResult};

/// Opens the store a URL names:
///
/// | URL | store |
/// |---|---|
/// | `memory:` | [`MemoryStore`] (this process only) |
/// | `sqlite:PATH` or `sqlite://PATH` | `SqliteStore` (feature `sqlite`) |
/// | `redis://…`, `rediss://…` | `RedisStore` (feature `redis`); `?allow_without_persistence=true` accepts a server with `appendonly no` |
/// | `redis+cluster://HOST:PORT,HOST:PORT`, `rediss+cluster://…` | `RedisStore` on Redis Cluster, by any of its nodes (feature `redis`; docs/stores.md, "Redis Cluster") |
/// | `postgres://…`, `postgresql://…` | `PostgresStore` (feature `postgres`) |
///
/// A scheme whose feature was not compiled in is a clear error naming the feature.
///
/// Any of them takes a [`NearCache`] of completed results in this process (off unless
/// asked for; docs/stores.md, "Near cache"), by query parameters that are removed before
/// the URL reaches the store:
///
/// | parameter | meaning |
/// |---|---|
/// | `near_cache=N` | keep up to `N` completed records (`0`: off, the default) |
/// | `near_cache_max_bytes=N` | and at most `N` bytes of them (default 64 MiB) |
/// | `near_cache_max_age=DURATION` | serve a copy at most this long after it was read (`30s`, `5m`; default: until the store's expiry) |
///
/// `redis://10.0.0.5:6379/?near_cache=10000&near_cache_max_age=1m`.
pub async fn open(url: &str) -> StoreResult<Arc<dyn Store>> {
    let (url, near) = near_cache_options(url)?;
    let store = open_store(&url).await?;
    Ok(match near {
        Some(near) => near.wrap(store),
        None => store,
    })
}

async fn open_store(url: &str) -> StoreResult<Arc<dyn Store>> {
    let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        "sqlite" => open_sqlite(rest.strip_prefix("//").unwrap_or(rest)).await,
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => open_redis(url).await,
        "postgres" | "postgresql" => open_postgres(url).await,
        _ => Err(StoreError::unavailable_message(format!(
            "unknown store URL {url:?}: use memory:, sqlite:PATH, redis://HOST:PORT, redis+cluster://HOST:PORT,HOST:PORT or postgres://USER@HOST/DB"
        ))),
    }
}

/// The near cache a URL asks for.
#[derive(Debug, Default, PartialEq)]
struct NearOptions {
    entries: usize,
    bytes: Option<u64>,
    max_age: Option<Duration>,
}

impl NearOptions {
    fn wrap(self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        let mut builder = NearCache::builder(store).max_entries(self.entries);
        if let Some(bytes) = self.bytes {
            builder = builder.max_bytes(bytes);
        }
        if let Some(max_age) = self.max_age {
            builder = builder.max_age(max_age);
        }
        Arc::new(builder.build())
    }
}

/// `url` without the `near_cache*` query parameters, and the near cache they ask for
/// (`None`: none, or `near_cache=0`). Other parameters are left, in order, for the store.
fn near_cache_options(original: &str) -> StoreResult<(String, Option<NearOptions>)> {
    let url = original;
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut near = NearOptions::default();
    let (mut entries, mut extra) = (None, None);
    let mut kept = Vec::new();
    for part in query.split('&').filter(|part| !part.is_empty()) {
        let (name, value) = part.split_once('=').unwrap_or((part, ""));
        let bad = |expected: &str| {
            StoreError::unavailable_message(format!(
                "store URL parameter {name}={value:?}: expected {expected}"
            ))
        };
        match name {
            "near_cache" => {
                let n = value.parse().map_err(|_| {
                    bad("a number of completed records to keep in this process, e.g. near_cache=10000 (0: off)")
                })?;
                entries = Some(n);
            }
            "near_cache_max_bytes" => {
                let n = value
                    .parse()
                    .map_err(|_| bad("a number of bytes, e.g. near_cache_max_bytes=67108864"))?;
                near.bytes = Some(n);
                extra = Some(name);
            }
            "near_cache_max_age" => {
                let age = humantime::parse_duration(value)
                    .map_err(|_| bad("a duration, e.g. near_cache_max_age=30s or 5m"))?;
                near.max_age = Some(age);
                extra = Some(name);
            }
            _ => kept.push(part),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    match (entries, extra) {
        // Nothing of ours: the URL exactly as given (a SQLite path may hold a `?`).
        (None, None) => Ok((original.to_owned(), None)),
        (None, Some(name)) => Err(StoreError::unavailable_message(format!(
            "store URL parameter {name} without near_cache=N: add near_cache=10000 (how many completed records to keep) to turn the near cache on"
        ))),
        (Some(0), _) => Ok((url, None)),
        (Some(n), _) => {
            near.entries = n;
            Ok((url, Some(near)))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_cache_parameters_are_read_and_removed() {
        let (url, near) = near_cache_options(
            "redis://h:6379/?allow_without_persistence=true&near_cache=500&near_cache_max_age=30s&near_cache_max_bytes=1024",
        )
        .unwrap();
        assert_eq!(url, "redis://h:6379/?allow_without_persistence=true");
        assert_eq!(
            near,
            Some(NearOptions {
                entries: 500,
                bytes: Some(1024),
                max_age: Some(Duration::from_secs(30)),
            })
        );
        let (url, near) = near_cache_options("postgres://u@h/db?near_cache=10").unwrap();
        assert_eq!(
            (url.as_str(), near.map(|n| n.entries)),
            ("postgres://u@h/db", Some(10))
        );
        // Off: absent, or zero; the URL is left as it was.
        for plain in ["sqlite:/tmp/x.db", "redis://h/?a=1", "sqlite:/tmp/odd?&"] {
            assert_eq!(near_cache_options(plain).unwrap(), (plain.to_owned(), None));
        }
        assert_eq!(
            near_cache_options("memory:?near_cache=0").unwrap(),
            ("memory:".to_owned(), None)
        );
    }

    #[test]
    fn a_bad_near_cache_parameter_says_what_to_write() {
        for (url, says) in [
            ("memory:?near_cache=lots", "near_cache=10000"),
            ("memory:?near_cache=5&near_cache_max_age=soon", "30s"),
            ("memory:?near_cache=5&near_cache_max_bytes=-1", "bytes"),
            ("memory:?near_cache_max_age=5s", "add near_cache=10000"),
        ] {
            let err = near_cache_options(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
