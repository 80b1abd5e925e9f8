//! Triton's `version_policy`: which version folders of a model serve.

use serde::Deserialize;

/// Triton's `version_policy`: which version folders of a model serve. In a `config.yaml`,
/// as Triton writes it: `{latest: {num_versions: 2}}`, `{all: {}}` or `{specific: {versions:
/// [1, 3]}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "VersionPolicyKeys")]
pub enum VersionPolicy {
    /// The newest `num_versions` versions (Triton's default is the newest one).
    Latest { num_versions: usize },
    /// Every version.
    All {},
    /// These versions.
    Specific { versions: Vec<u64> },
}

/// [`VersionPolicy`] as a `config.yaml` writes it: one of the three keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionPolicyKeys {
    latest: Option<LatestKeys>,
    all: Option<NoKeys>,
    specific: Option<SpecificKeys>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LatestKeys {
    #[serde(default = "one")]
    num_versions: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecificKeys {
    versions: Vec<u64>,
}

/// `{}`: a policy with nothing to set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoKeys {}

fn one() -> usize {
    1
}

impl TryFrom<VersionPolicyKeys> for VersionPolicy {
    type Error = String;

    fn try_from(keys: VersionPolicyKeys) -> Result<Self, String> {
        match (keys.latest, keys.all, keys.specific) {
            (Some(l), None, None) => Ok(VersionPolicy::Latest {
                num_versions: l.num_versions,
            }),
            (None, Some(_), None) => Ok(VersionPolicy::All {}),
            (None, None, Some(s)) => Ok(VersionPolicy::Specific {
                versions: s.versions,
            }),
            _ => Err("give one of latest, all or specific".into()),
        }
    }
}

impl VersionPolicy {
    /// The versions that serve among `available` (ascending): those the policy names that are
    /// there, in ascending order; an error when it names none that is there.
    pub fn named(&self, available: &[u64]) -> Result<Vec<u64>, String> {
        let named: Vec<u64> = match self {
            VersionPolicy::Latest { num_versions } => {
                let n = (*num_versions).max(1).min(available.len());
                available[available.len() - n..].to_vec()
            }
            VersionPolicy::All {} => available.to_vec(),
            VersionPolicy::Specific { versions } => available
                .iter()
                .copied()
                .filter(|v| versions.contains(v))
                .collect(),
        };
        if named.is_empty() {
            return Err(format!(
                "version_policy names no version the folder holds: it holds {available:?}, and \
                 the policy is {self:?}"
            ));
        }
        Ok(named)
    }
}
