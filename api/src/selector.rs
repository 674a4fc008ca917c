//! A label selector (the `matchLabels`/`matchExpressions` shape of Kubernetes) with a pure
//! matcher, so profiles can select namespaces without pulling in the API machinery.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// An empty selector; railguard treats it as "selects nothing" for exemptions.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether the labels satisfy every term of the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| e.matches(labels))
    }

    /// Rejects expressions Kubernetes would reject (values with Exists, none with In).
    pub fn validate(&self) -> Result<(), String> {
        for e in &self.match_expressions {
            match e.operator {
                SelectorOperator::In | SelectorOperator::NotIn if e.values.is_empty() => {
                    return Err(format!("{:?} on {:?} needs values", e.operator, e.key));
                }
                SelectorOperator::Exists | SelectorOperator::DoesNotExist
                    if !e.values.is_empty() =>
                {
                    return Err(format!("{:?} on {:?} takes no values", e.operator, e.key));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl LabelSelectorRequirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}
