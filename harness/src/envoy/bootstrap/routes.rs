//! Envoy's route matching over a route table: the virtual host an authority selects and the
//! route a path takes. The router uses it to decide where a request goes and the engine's
//! `xds.*` properties (through [`RouteTable`]) to name the route and cluster; both read the
//! table, neither asks the other.

use super::{Bootstrap, Route, RouteAction, RouteConfig, RouteMatch, VirtualHost};
use crate::engine::host::properties::{RouteTable, XdsRoute};

impl RouteTable for Bootstrap {
    fn xds_route(
        &self,
        (address, port): &(String, u16),
        authority: &str,
        path: &str,
    ) -> Option<XdsRoute<'_>> {
        let listener = self
            .listeners
            .iter()
            .find(|l| l.port == *port && l.address == *address)?;
        let routes = &listener.http()?.routes;
        let virtual_host = routes.virtual_host(authority)?;
        let route = routes.route(authority, path)?;
        let cluster = match &route.action {
            RouteAction::Cluster(name) => {
                self.cluster(name).map(|c| (c.name.as_str(), &c.metadata))
            }
            RouteAction::Direct { .. } => None,
        };
        Some(XdsRoute {
            virtual_host: &virtual_host.name,
            name: &route.xds.name,
            metadata: &route.xds.metadata,
            cluster,
        })
    }
}

impl RouteConfig {
    /// Envoy's virtual host selection: exact domain, then the longest `*.suffix` / `suffix`
    /// wildcard, then the longest `prefix*` wildcard, then `*`.
    pub fn virtual_host(&self, authority: &str) -> Option<&VirtualHost> {
        let host = authority.to_ascii_lowercase();
        let exact = self
            .virtual_hosts
            .iter()
            .find(|vh| vh.domains.contains(&host));
        if exact.is_some() {
            return exact;
        }
        let best = |pick: &dyn Fn(&str) -> Option<usize>| {
            self.virtual_hosts
                .iter()
                .filter_map(|vh| {
                    vh.domains
                        .iter()
                        .filter_map(|d| pick(d))
                        .max()
                        .map(|n| (n, vh))
                })
                .max_by_key(|(n, _)| *n)
                .map(|(_, vh)| vh)
        };
        best(&|d: &str| {
            let suffix = d.strip_prefix('*')?;
            (!suffix.is_empty() && host.ends_with(suffix) && host.len() > suffix.len())
                .then_some(suffix.len())
        })
        .or_else(|| {
            best(&|d: &str| {
                let prefix = d.strip_suffix('*')?;
                (!prefix.is_empty() && host.starts_with(prefix) && host.len() > prefix.len())
                    .then_some(prefix.len())
            })
        })
        .or_else(|| {
            self.virtual_hosts
                .iter()
                .find(|vh| vh.domains.iter().any(|d| d == "*"))
        })
    }

    /// The first route of the matching virtual host whose match accepts the path (query string
    /// excluded, as Envoy does for `path` and `prefix`).
    pub fn route(&self, authority: &str, path: &str) -> Option<&Route> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        self.virtual_host(authority)?
            .routes
            .iter()
            .find(|r| match &r.matcher {
                RouteMatch::Prefix(p) => path.starts_with(p.as_str()),
                RouteMatch::Path(p) => path == p,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, domains: &[&str], routes: Vec<Route>) -> VirtualHost {
        VirtualHost {
            name: name.into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes,
        }
    }

    fn to_cluster(matcher: RouteMatch, cluster: &str) -> Route {
        Route {
            matcher,
            action: RouteAction::Cluster(cluster.into()),
            xds: Default::default(),
        }
    }

    #[test]
    fn routes_by_domain_and_path() {
        let rc = RouteConfig {
            virtual_hosts: vec![
                host(
                    "all",
                    &["*"],
                    vec![
                        Route {
                            matcher: RouteMatch::Path("/local".into()),
                            action: RouteAction::Direct {
                                status: 200,
                                body: b"hi".to_vec(),
                            },
                            xds: Default::default(),
                        },
                        to_cluster(RouteMatch::Prefix("/".into()), "backend"),
                    ],
                ),
                host(
                    "api",
                    &["api.example.com", "*.example.com"],
                    vec![to_cluster(RouteMatch::Prefix("/".into()), "api")],
                ),
            ],
        };
        assert!(matches!(
            rc.route("x.test", "/local").unwrap().action,
            RouteAction::Direct { status: 200, .. }
        ));
        assert!(
            matches!(&rc.route("x.test", "/local/more?q").unwrap().action, RouteAction::Cluster(c) if c == "backend")
        );
        assert!(
            matches!(&rc.route("API.example.com", "/").unwrap().action, RouteAction::Cluster(c) if c == "api")
        );
        assert!(
            matches!(&rc.route("www.example.com", "/").unwrap().action, RouteAction::Cluster(c) if c == "api")
        );
    }
}
