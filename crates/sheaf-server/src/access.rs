//! Who may call what.
//!
//! Every route and RPC has a [`Scope`]:
//! - **open**: liveness and readiness, so probes need no key;
//! - **inference**: inference, model metadata and the OpenAI routes, which take an API key
//!   (`--api-key`) or the admin key;
//! - **admin**: the repository API (index, load, unload), statistics and the dashboard, which
//!   take the admin key (`--admin-key`). Without an admin key they take the API keys.
//!
//! With no keys at all every scope is open, as before keys were given. Keys travel as
//! `Authorization: Bearer KEY` over HTTP and as `authorization` metadata over gRPC, which is
//! what the `openai` client's `api_key` and `tritonclient`'s `headers` send. Keys are compared
//! in constant time.
//!
//! Triton's restricted API groups ([`crate::restricted`]) come on top: a category they
//! restrict also needs its header, whatever the keys.

use subtle::ConstantTimeEq;

use crate::restricted::{Api, Restrictions};

/// The keys the server takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessConfig {
    /// Keys for inference. Empty: inference is open.
    pub api_keys: Vec<String>,
    /// Keys for the repository API and statistics (and for inference). Empty: the API keys
    /// serve.
    pub admin_keys: Vec<String>,
    /// `GET /metrics` needs the admin key (or, without one, an API key).
    pub protect_metrics: bool,
    /// The HTTP port's restricted API groups (`--http-restricted-api`).
    pub http_restricted: Restrictions,
    /// The gRPC port's restricted groups (`--grpc-restricted-protocol`).
    pub grpc_restricted: Restrictions,
}

/// What a request is allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Open,
    Inference,
    Admin,
}

impl Scope {
    /// The scope of an API category: health is open to probes; the repository API, statistics
    /// and the trace and log settings take the admin key; the rest an API key.
    pub fn of(api: Api) -> Scope {
        match api {
            Api::Health => Scope::Open,
            Api::ModelRepository | Api::Statistics | Api::Trace | Api::Logging => Scope::Admin,
            Api::Metadata | Api::Inference | Api::SharedMemory | Api::ModelConfig => {
                Scope::Inference
            }
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No key, or one the server does not know: 401 / UNAUTHENTICATED.
    Unauthenticated,
    /// A valid API key on an admin route: 403 / PERMISSION_DENIED.
    NotAdmin,
}

impl Denied {
    pub fn message(self) -> &'static str {
        match self {
            Denied::Unauthenticated => {
                "missing or unknown API key: send it as 'Authorization: Bearer KEY'"
            }
            Denied::NotAdmin => "this route needs the admin key; the key given is an API key",
        }
    }
}

impl AccessConfig {
    /// True when some route needs a key or a restricted group's header.
    pub fn is_protected(&self) -> bool {
        !self.api_keys.is_empty()
            || !self.admin_keys.is_empty()
            || self.http_restricted.any()
            || self.grpc_restricted.any()
    }

    /// Checks the `Authorization` header value (`Bearer KEY`) against `scope`.
    pub fn check(&self, scope: Scope, authorization: Option<&[u8]>) -> Result<(), Denied> {
        let key = authorization.and_then(bearer);
        let known = |keys: &[String]| key.is_some_and(|k| any_equal(keys, k));
        match scope {
            Scope::Open => Ok(()),
            Scope::Inference if self.api_keys.is_empty() => Ok(()),
            Scope::Inference if known(&self.api_keys) || known(&self.admin_keys) => Ok(()),
            Scope::Inference => Err(Denied::Unauthenticated),
            Scope::Admin if self.admin_keys.is_empty() => {
                self.check(Scope::Inference, authorization)
            }
            Scope::Admin if known(&self.admin_keys) => Ok(()),
            Scope::Admin if known(&self.api_keys) => Err(Denied::NotAdmin),
            Scope::Admin => Err(Denied::Unauthenticated),
        }
    }
}

/// The key of an `Authorization: Bearer KEY` value (the scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, key) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| key.trim_ascii())
}

/// Whether `key` is one of `keys`. Every key is compared, each in constant time, so the time
/// taken says nothing about which key or how much of it matched.
fn any_equal(keys: &[String], key: &[u8]) -> bool {
    keys.iter().fold(false, |found, k| {
        found | bool::from(k.as_bytes().ct_eq(key))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(api: &[&str], admin: &[&str]) -> AccessConfig {
        AccessConfig {
            api_keys: api.iter().map(|s| s.to_string()).collect(),
            admin_keys: admin.iter().map(|s| s.to_string()).collect(),
            protect_metrics: false,
            ..AccessConfig::default()
        }
    }

    #[test]
    fn without_keys_everything_is_open() {
        let open = AccessConfig::default();
        assert!(!open.is_protected());
        for scope in [Scope::Open, Scope::Inference, Scope::Admin] {
            assert_eq!(open.check(scope, None), Ok(()));
        }
    }

    #[test]
    fn api_keys_open_inference_and_the_admin_key_opens_everything() {
        let c = config(&["k1", "k2"], &["root"]);
        assert_eq!(c.check(Scope::Open, None), Ok(()));
        assert_eq!(
            c.check(Scope::Inference, None),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(c.check(Scope::Inference, Some(b"Bearer k1")), Ok(()));
        assert_eq!(c.check(Scope::Inference, Some(b"bearer k2")), Ok(()));
        assert_eq!(c.check(Scope::Inference, Some(b"Bearer root")), Ok(()));
        assert_eq!(
            c.check(Scope::Inference, Some(b"Bearer k3")),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            c.check(Scope::Inference, Some(b"Basic k1")),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            c.check(Scope::Inference, Some(b"Bearer k")),
            Err(Denied::Unauthenticated),
            "a prefix of a key is not the key"
        );
        assert_eq!(
            c.check(Scope::Admin, Some(b"Bearer k1")),
            Err(Denied::NotAdmin)
        );
        assert_eq!(c.check(Scope::Admin, Some(b"Bearer root")), Ok(()));
        assert_eq!(c.check(Scope::Admin, None), Err(Denied::Unauthenticated));
    }

    #[test]
    fn without_an_admin_key_the_api_keys_open_admin_routes() {
        let c = config(&["k1"], &[]);
        assert_eq!(c.check(Scope::Admin, Some(b"Bearer k1")), Ok(()));
        assert_eq!(c.check(Scope::Admin, None), Err(Denied::Unauthenticated));
    }

    #[test]
    fn an_admin_key_alone_leaves_inference_open() {
        let c = config(&[], &["root"]);
        assert_eq!(c.check(Scope::Inference, None), Ok(()));
        assert_eq!(c.check(Scope::Admin, None), Err(Denied::Unauthenticated));
        assert_eq!(c.check(Scope::Admin, Some(b"Bearer root")), Ok(()));
    }
}
