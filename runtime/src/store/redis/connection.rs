//! The connection [`RedisStore`](super::RedisStore) talks through: one server (the redis
//! crate's `ConnectionManager`) or a Redis Cluster (its cluster client, which sends each
//! script to the primary of its keys' slot), the cluster URL form, and commands sent to
//! every primary (the server settings the store checks on connect).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// One server or a cluster; cheap to clone (both multiplex one connection per node).
#[derive(Clone)]
pub(super) enum Conn {
    /// A standalone server (or the primary a Sentinel-aware URL names).
    Single(ConnectionManager),
    /// A Redis Cluster: commands go to the primary of their first key's slot, following
    /// `MOVED` and `ASK` redirections.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Sends `cmd` to every primary (the one server, named `addr`, when standalone) and
    /// returns each primary's address and answer. Fails only if the command could not be
    /// sent; a primary's error reply is its answer.
    pub async fn on_primaries(
        &mut self,
        cmd: &Cmd,
        addr: &str,
    ) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        match self {
            Conn::Single(c) => Ok(vec![(addr.to_owned(), cmd.query_async(c).await)]),
            Conn::Cluster(c) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                // Without a response policy the crate answers a map: address -> reply.
                let reply = c.route_command(cmd.clone(), routing).await?;
                let Value::Map(pairs) = reply else {
                    return Ok(vec![(addr.to_owned(), Ok(reply))]);
                };
                Ok(pairs
                    .into_iter()
                    .map(|(node, answer)| {
                        let node = match node {
                            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                            other => format!("{other:?}"),
                        };
                        let answer = match answer {
                            Value::ServerError(e) => Err(e.into()),
                            v => Ok(v),
                        };
                        (node, answer)
                    })
                    .collect())
            }
        }
    }
}

/// The cluster URL schemes, and the scheme of the node URLs each stands for.
const CLUSTER_SCHEMES: [(&str, &str); 2] = [
    ("redis+cluster://", "redis://"),
    ("rediss+cluster://", "rediss://"),
];

/// The seed nodes of a cluster URL,
/// `redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/0][?PARAMS]`, as one
/// `redis://[USER:PASSWORD@]HOST:PORT/[?PARAMS]` URL each (the credentials and parameters
/// apply to every node). `None` if `url` is not a cluster URL; an error saying what to
/// write if it names no node or a database other than 0 (a cluster has only database 0).
pub(super) fn cluster_nodes(url: &str) -> Option<Result<Vec<String>, String>> {
    let (rest, scheme) = CLUSTER_SCHEMES
        .iter()
        .find_map(|(cluster, node)| url.strip_prefix(cluster).map(|rest| (rest, *node)))?;
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db != "0" {
        return Some(Err(format!(
            "Redis Cluster has only database 0: drop `/{db}` from the URL (give each store its own key prefix instead)"
        )));
    }
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), authority),
    };
    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}{credentials}{host}/{query}"))
        .collect();
    if nodes.is_empty() {
        return Some(Err(
            "a Redis Cluster URL names no node: write redis+cluster://HOST:PORT,HOST:PORT (any primaries or replicas of the cluster; the rest are discovered)".to_owned(),
        ));
    }
    Some(Ok(nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_url_names_its_seed_nodes() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.5:7000,10.0.0.6:7001").unwrap(),
            Ok(vec![
                "redis://10.0.0.5:7000/".to_owned(),
                "redis://10.0.0.6:7001/".to_owned()
            ])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://app:s3cr@t@h1:7000,h2:7000/0?protocol=resp3").unwrap(),
            Ok(vec![
                "rediss://app:s3cr@t@h1:7000/?protocol=resp3".to_owned(),
                "rediss://app:s3cr@t@h2:7000/?protocol=resp3".to_owned()
            ])
        );
        assert_eq!(
            cluster_nodes("redis+cluster://h1:7000?x=1").unwrap(),
            Ok(vec!["redis://h1:7000/?x=1".to_owned()])
        );
        assert_eq!(cluster_nodes("redis://h1:7000"), None);
    }

    #[test]
    fn a_bad_cluster_url_says_what_to_write() {
        let db = cluster_nodes("redis+cluster://h1:7000/3")
            .unwrap()
            .unwrap_err();
        assert!(db.contains("only database 0"), "{db}");
        let none = cluster_nodes("redis+cluster://,/").unwrap().unwrap_err();
        assert!(none.contains("HOST:PORT,HOST:PORT"), "{none}");
    }
}
