//! Restricted API groups (Triton's `--http-restricted-api` and `--grpc-restricted-protocol`):
//! each group names some of the API categories below and a header with the value a request to
//! them must carry, a shared secret that PyTriton, BentoML and hand-written Triton command lines
//! use to keep the repository API and statistics from inference clients.
//!
//! A flag's value is `API[,API...]:KEY=VALUE`; the flag may be given once per group, and a
//! category may stand in one group only. Over HTTP the header is `KEY`; over gRPC the metadata
//! key is `triton-grpc-protocol-KEY`, as Triton names it. A request to a restricted category
//! without that header, or with another value, is refused with 403 / PERMISSION_DENIED and
//! "This ... is restricted, expecting header '...'", Triton's words. Values are compared in
//! constant time. The restrictions come on top of the keys of [`crate::access`]: a request
//! passes both.

use std::fmt;

use subtle::ConstantTimeEq;

/// The prefix of a gRPC restriction's metadata key.
pub const GRPC_PREFIX: &str = "triton-grpc-protocol-";

/// The API categories a group may restrict, in Triton's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Server liveness and readiness, and a model's readiness.
    Health,
    /// Server and model metadata.
    Metadata,
    /// Inference: KServe's, the generate extension's, OpenAI's and TEI's routes.
    Inference,
    /// The shared-memory extension.
    SharedMemory,
    /// A model's configuration.
    ModelConfig,
    /// The repository API: index, load, unload.
    ModelRepository,
    /// Statistics (and sheaf's `/stats`).
    Statistics,
    /// The trace extension's settings.
    Trace,
    /// The logging extension's settings.
    Logging,
}

impl Api {
    pub const ALL: [Api; 9] = [
        Api::Health,
        Api::Metadata,
        Api::Inference,
        Api::SharedMemory,
        Api::ModelConfig,
        Api::ModelRepository,
        Api::Statistics,
        Api::Trace,
        Api::Logging,
    ];

    /// The category's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Api::Health => "health",
            Api::Metadata => "metadata",
            Api::Inference => "inference",
            Api::SharedMemory => "shared-memory",
            Api::ModelConfig => "model-config",
            Api::ModelRepository => "model-repository",
            Api::Statistics => "statistics",
            Api::Trace => "trace",
            Api::Logging => "logging",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The header a restricted category needs, and its value.
#[derive(Clone, PartialEq, Eq)]
struct Secret {
    header: String,
    value: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// The restricted groups of one protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restrictions {
    /// The secret of each category, by [`Api::index`]; `None`: not restricted.
    secrets: [Option<Secret>; 9],
    /// What the refusal calls the category: "API" (HTTP) or "protocol" (gRPC).
    noun: &'static str,
}

impl Restrictions {
    /// HTTP's groups, from each `--http-restricted-api` value.
    pub fn http(groups: &[String]) -> Result<Restrictions, String> {
        Restrictions::parse(groups, "", "API", "--http-restricted-api")
    }

    /// gRPC's groups, from each `--grpc-restricted-protocol` value.
    pub fn grpc(groups: &[String]) -> Result<Restrictions, String> {
        Restrictions::parse(
            groups,
            GRPC_PREFIX,
            "protocol",
            "--grpc-restricted-protocol",
        )
    }

    fn parse(
        groups: &[String],
        prefix: &str,
        noun: &'static str,
        flag: &str,
    ) -> Result<Restrictions, String> {
        let mut restrictions = Restrictions {
            noun,
            ..Restrictions::default()
        };
        for group in groups {
            let bad = |why: &str| format!("{flag} '{group}': {why}");
            let form =
                "give APIS:KEY=VALUE, for instance model-repository,statistics:admin-key=SECRET";
            let (apis, pair) = group.split_once(':').ok_or_else(|| bad(form))?;
            let (key, value) = pair.split_once('=').ok_or_else(|| bad(form))?;
            let key = key.trim().to_ascii_lowercase();
            if key.is_empty() || value.is_empty() {
                return Err(bad("the header and its value may not be empty"));
            }
            let header = format!("{prefix}{key}");
            if axum::http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(bad(&format!("'{key}' is not a header name")));
            }
            for name in apis.split(',').map(str::trim) {
                let api = Api::ALL
                    .into_iter()
                    .find(|a| a.name() == name)
                    .ok_or_else(|| {
                        let known: Vec<_> = Api::ALL.iter().map(|a| a.name()).collect();
                        bad(&format!(
                            "unknown restricted api '{name}' (known: {})",
                            known.join(", ")
                        ))
                    })?;
                let slot = &mut restrictions.secrets[api.index()];
                if slot.is_some() {
                    return Err(bad(&format!(
                        "api '{name}' can not be specified in multiple config groups"
                    )));
                }
                *slot = Some(Secret {
                    header: header.clone(),
                    value: value.to_string(),
                });
            }
        }
        Ok(restrictions)
    }

    /// True when some category is restricted.
    pub fn any(&self) -> bool {
        self.secrets.iter().any(Option::is_some)
    }

    /// Whether a request to `api` may pass, given the value of a header by its (lower-case)
    /// name; the refusal's message otherwise.
    pub fn check<'a>(
        &self,
        api: Api,
        header: impl FnOnce(&str) -> Option<&'a [u8]>,
    ) -> Result<(), String> {
        let Some(secret) = &self.secrets[api.index()] else {
            return Ok(());
        };
        let given = header(&secret.header).unwrap_or_default();
        if bool::from(given.ct_eq(secret.value.as_bytes())) {
            Ok(())
        } else {
            Err(format!(
                "This {} is restricted, expecting header '{}'",
                self.noun, secret.header
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(values: &[&str]) -> Vec<String> {
        values.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_restricted_category_needs_its_header_and_the_others_are_open() {
        let r = Restrictions::http(&groups(&[
            "model-repository,statistics:Admin-Key=s3cret",
            "inference:infer-key=v=1",
        ]))
        .unwrap();
        assert!(r.any());
        let none = |_: &str| None;
        assert_eq!(r.check(Api::Health, none), Ok(()));
        assert_eq!(r.check(Api::Metadata, none), Ok(()));
        let refused = r.check(Api::ModelRepository, none).unwrap_err();
        assert_eq!(
            refused,
            "This API is restricted, expecting header 'admin-key'"
        );
        let admin = |name: &str| (name == "admin-key").then_some(&b"s3cret"[..]);
        assert_eq!(r.check(Api::ModelRepository, admin), Ok(()));
        assert_eq!(r.check(Api::Statistics, admin), Ok(()));
        assert!(
            r.check(Api::Inference, admin).is_err(),
            "another group's header"
        );
        let wrong = |name: &str| (name == "admin-key").then_some(&b"s3cre"[..]);
        assert!(r.check(Api::ModelRepository, wrong).is_err());
        let infer = |name: &str| (name == "infer-key").then_some(&b"v=1"[..]);
        assert_eq!(
            r.check(Api::Inference, infer),
            Ok(()),
            "value after the first '='"
        );
    }

    #[test]
    fn grpc_headers_carry_tritons_prefix() {
        let r = Restrictions::grpc(&groups(&["health:k=v"])).unwrap();
        let sent = |name: &str| (name == "triton-grpc-protocol-k").then_some(&b"v"[..]);
        assert_eq!(r.check(Api::Health, sent), Ok(()));
        assert_eq!(
            r.check(Api::Health, |_| None).unwrap_err(),
            "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
        );
    }

    #[test]
    fn bad_groups_are_refused_with_the_reason() {
        let cases = [
            (
                "model-reposit,health:k1=v1",
                "unknown restricted api 'model-reposit'",
            ),
            ("health:k", "APIS:KEY=VALUE"),
            ("health", "APIS:KEY=VALUE"),
            ("health:=v", "may not be empty"),
            ("health:k=", "may not be empty"),
            ("health:bad key=v", "not a header name"),
        ];
        for (group, why) in cases {
            let err = Restrictions::http(&groups(&[group])).unwrap_err();
            assert!(err.contains(why), "{group}: {err}");
            assert!(err.contains("--http-restricted-api"), "{err}");
        }
        let twice = Restrictions::grpc(&groups(&[
            "model-repository,health:k1=v1",
            "metadata,health:k2=v2",
        ]))
        .unwrap_err();
        assert!(
            twice.contains("api 'health' can not be specified in multiple config groups"),
            "{twice}"
        );
    }

    #[test]
    fn no_groups_restrict_nothing() {
        let r = Restrictions::http(&[]).unwrap();
        assert!(!r.any());
        for api in Api::ALL {
            assert_eq!(r.check(api, |_| None), Ok(()));
        }
    }

    #[test]
    fn the_secret_stays_out_of_debug_output() {
        let r = Restrictions::http(&groups(&["trace:k=hidden-value"])).unwrap();
        assert!(!format!("{r:?}").contains("hidden-value"));
    }
}
