//! The cluster-wide cap on invasive runs and the order nodes take its slots in: pure rules
//! the fleet controller (which sees every Node), the node daemons (which take the slot
//! Leases) and the certification-wave bench share.
//!
//! - `certification.maxConcurrentInvasive` is a count (`4`) or a percentage of the
//!   profile's nodes (`"5%"`, rounded up, at least 1), like a Deployment's `maxUnavailable`.
//! - A daemon held back by the cap marks its Node `railguard.io/invasive-waiting`. The fleet
//!   controller writes `status.invasive` on the profile: the resolved slot count and the
//!   queue, the waiting nodes with the oldest certificate first (a node never certified
//!   before all), as many as there are slots. A daemon takes a free slot only while its node
//!   is in that queue, or while the queue has room; so the oldest certificates are renewed
//!   first, and a node with a fresh certificate cannot overtake them.
//! - Without a fresh `status.invasive` (no fleet controller, or one that stopped), a count
//!   is its own slot count and a percentage falls back to one slot: first come, first
//!   served, never more runs than asked for.

use std::borrow::Cow;
use std::fmt;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most invasive slots a profile may resolve to (one Lease each; the chart's RBAC names
/// them all for a percentage).
pub const MAX_CONCURRENT_INVASIVE: u32 = 256;

/// How long a daemon's `railguard.io/invasive-waiting` mark counts: a daemon renews it
/// every [`WAITING_RENEW`] while it waits, so a mark left by a prober that died drops out
/// of the queue after this.
pub const WAITING_FRESH: SignedDuration = SignedDuration::from_secs(15 * 60);
/// How often a waiting daemon renews its mark (a Node write: 2,000 cold nodes renewing
/// every 5 minutes are under 7 writes a second).
pub const WAITING_RENEW: SignedDuration = SignedDuration::from_secs(5 * 60);
/// How old `status.invasive` may be before daemons stop following its queue (the fleet
/// controller rewrites it at least this often while nodes wait).
pub const STATUS_FRESH: SignedDuration = SignedDuration::from_secs(10 * 60);

/// `certification.maxConcurrentInvasive`: a count or a percentage of the profile's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxConcurrentInvasive {
    Count(u32),
    Percent(u32),
}

impl Default for MaxConcurrentInvasive {
    fn default() -> Self {
        MaxConcurrentInvasive::Percent(5)
    }
}

impl MaxConcurrentInvasive {
    /// The slots for a profile of `nodes` nodes: a count as given, a percentage rounded up;
    /// always between 1 and [`MAX_CONCURRENT_INVASIVE`].
    pub fn resolve(self, nodes: u32) -> u32 {
        let n = match self {
            MaxConcurrentInvasive::Count(n) => n,
            MaxConcurrentInvasive::Percent(p) => {
                u32::try_from((u64::from(nodes) * u64::from(p)).div_ceil(100)).unwrap_or(u32::MAX)
            }
        };
        n.clamp(1, MAX_CONCURRENT_INVASIVE)
    }

    /// The slots when no fleet controller has counted the nodes: a count as given, a
    /// percentage one slot.
    pub fn without_fleet(self) -> u32 {
        match self {
            MaxConcurrentInvasive::Count(n) => n.clamp(1, MAX_CONCURRENT_INVASIVE),
            MaxConcurrentInvasive::Percent(_) => 1,
        }
    }

    /// The most slots this setting can ever resolve to (what the chart's RBAC names).
    pub fn most_slots(self) -> u32 {
        match self {
            MaxConcurrentInvasive::Count(n) => n.clamp(1, MAX_CONCURRENT_INVASIVE),
            MaxConcurrentInvasive::Percent(_) => MAX_CONCURRENT_INVASIVE,
        }
    }

    /// Why the value is out of range, if it is.
    pub fn problem(self) -> Option<String> {
        match self {
            MaxConcurrentInvasive::Count(n) if n == 0 || n > MAX_CONCURRENT_INVASIVE => Some(
                format!("must be a count between 1 and {MAX_CONCURRENT_INVASIVE}, or a percentage"),
            ),
            MaxConcurrentInvasive::Percent(p) if p == 0 || p > 100 => {
                Some("a percentage must be between 1% and 100%".into())
            }
            _ => None,
        }
    }
}

impl fmt::Display for MaxConcurrentInvasive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxConcurrentInvasive::Count(n) => write!(f, "{n}"),
            MaxConcurrentInvasive::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl std::str::FromStr for MaxConcurrentInvasive {
    type Err = String;

    /// `"12"` or `"5%"`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = || format!("{s:?} is neither a count (4) nor a percentage (\"5%\")");
        match t.strip_suffix('%') {
            Some(p) => p
                .parse()
                .map(MaxConcurrentInvasive::Percent)
                .map_err(|_| bad()),
            None => t
                .parse()
                .map(MaxConcurrentInvasive::Count)
                .map_err(|_| bad()),
        }
    }
}

impl Serialize for MaxConcurrentInvasive {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxConcurrentInvasive::Count(n) => s.serialize_u32(*n),
            MaxConcurrentInvasive::Percent(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for MaxConcurrentInvasive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum IntOrString {
            Int(u32),
            Str(String),
        }
        // The generated schema is nullable (kube marks an optional int-or-string so); null
        // reads as the default, as the API server's defaulting would for a non-nullable one.
        match Option::<IntOrString>::deserialize(d)? {
            None => Ok(MaxConcurrentInvasive::default()),
            Some(IntOrString::Int(n)) => Ok(MaxConcurrentInvasive::Count(n)),
            // An integer-or-string field: the string form must be a percentage, as
            // Kubernetes reads `maxUnavailable` (a bare "4" is refused there too).
            Some(IntOrString::Str(s)) => match s.parse() {
                Ok(p @ MaxConcurrentInvasive::Percent(_)) => Ok(p),
                _ => Err(serde::de::Error::custom(format!(
                    "maxConcurrentInvasive {s:?}: a string must be a percentage such as \"5%\""
                ))),
            },
        }
    }
}

impl schemars::JsonSchema for MaxConcurrentInvasive {
    fn schema_name() -> Cow<'static, str> {
        "MaxConcurrentInvasive".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [
                { "type": "integer", "minimum": 1, "maximum": MAX_CONCURRENT_INVASIVE },
                { "type": "string", "pattern": "^([1-9][0-9]?|100)%$" }
            ]
        })
    }
}

/// `status.invasive` of a FabricProfile, written by the fleet controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InvasiveStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computed_at: Option<Time>,
    /// The profile's nodes the slots were resolved against.
    pub nodes: u32,
    /// `maxConcurrentInvasive` resolved: the Leases `railguard-invasive-<profile>-0..slots`.
    pub slots: u32,
    /// Nodes whose daemon waits for a slot.
    pub waiting: u32,
    /// The waiting nodes whose turn it is, oldest certificate first (at most `slots`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<String>,
}

/// A node of the profile whose daemon waits for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingNode {
    pub name: String,
    /// When its current certificate was issued; `None`: never certified (goes first).
    pub certified_at: Option<Timestamp>,
}

/// Whether a `railguard.io/invasive-waiting` mark written at `since` still counts at `now`.
pub fn waiting_mark_counts(since: Timestamp, now: Timestamp) -> bool {
    now.duration_since(since) <= WAITING_FRESH
}

/// The queue of waiting nodes: never certified first, then the oldest certificate, then by
/// name (stable); the first `slots` of them.
pub fn invasive_queue(mut waiting: Vec<WaitingNode>, slots: u32) -> Vec<String> {
    waiting.sort_by(|a, b| {
        a.certified_at
            .is_some()
            .cmp(&b.certified_at.is_some())
            .then(a.certified_at.cmp(&b.certified_at))
            .then(a.name.cmp(&b.name))
    });
    waiting
        .into_iter()
        .take(usize::try_from(slots).unwrap_or(usize::MAX))
        .map(|w| w.name)
        .collect()
}

/// The fleet controller's `status.invasive` for a profile of `nodes` nodes (without
/// `computedAt`, which the writer stamps).
pub fn invasive_status(
    cap: MaxConcurrentInvasive,
    nodes: u32,
    waiting: Vec<WaitingNode>,
) -> InvasiveStatus {
    let slots = cap.resolve(nodes);
    let count = u32::try_from(waiting.len()).unwrap_or(u32::MAX);
    InvasiveStatus {
        computed_at: None,
        nodes,
        slots,
        waiting: count,
        queue: invasive_queue(waiting, slots),
    }
}

/// What a daemon may do about the cap now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotTurn {
    /// How many slots the profile has now (the Leases to try).
    pub slots: u32,
    /// Whether this node may take a free slot.
    pub may_take: bool,
    /// Why not, for the log and the Event.
    pub why_not: Option<String>,
}

/// Whether `node` may take a free slot: with a fresh `status.invasive`, only while it is in
/// the queue or the queue has room; without one, always (first come, first served), over
/// [`MaxConcurrentInvasive::without_fleet`] slots.
pub fn slot_turn(
    cap: MaxConcurrentInvasive,
    status: Option<&InvasiveStatus>,
    node: &str,
    now: Timestamp,
) -> SlotTurn {
    let fresh = status.filter(|s| {
        s.computed_at
            .as_ref()
            .is_some_and(|t| now.duration_since(t.0) <= STATUS_FRESH)
    });
    let Some(s) = fresh else {
        return SlotTurn {
            slots: cap.without_fleet(),
            may_take: true,
            why_not: None,
        };
    };
    let slots = s.slots.clamp(1, MAX_CONCURRENT_INVASIVE);
    let queued = s.queue.iter().any(|n| n == node);
    let room = s.queue.len() < usize::try_from(slots).unwrap_or(usize::MAX);
    SlotTurn {
        slots,
        may_take: queued || room,
        why_not: (!queued && !room).then(|| {
            format!(
                "{} waiting nodes with older certificates go first ({} slots)",
                s.queue.len(),
                slots
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_count_or_a_percentage_of_the_profiles_nodes() {
        use MaxConcurrentInvasive::*;
        assert_eq!(Count(4).resolve(2000), 4);
        assert_eq!(Percent(5).resolve(2000), 100);
        assert_eq!(Percent(5).resolve(10), 1, "rounded up");
        assert_eq!(Percent(5).resolve(0), 1, "at least one");
        assert_eq!(Percent(100).resolve(2000), MAX_CONCURRENT_INVASIVE);
        assert_eq!(Percent(5).without_fleet(), 1);
        assert_eq!(Count(7).without_fleet(), 7);
        assert_eq!(Percent(5).most_slots(), MAX_CONCURRENT_INVASIVE);
        for (text, want) in [("4", Count(4)), ("5%", Percent(5)), (" 12% ", Percent(12))] {
            assert_eq!(text.parse::<MaxConcurrentInvasive>(), Ok(want));
        }
        assert!("five".parse::<MaxConcurrentInvasive>().is_err());
        assert!("5.5%".parse::<MaxConcurrentInvasive>().is_err());
        assert!(Count(0).problem().is_some());
        assert!(Count(257).problem().is_some());
        assert!(Percent(0).problem().is_some());
        assert!(Percent(101).problem().is_some());
        assert!(Percent(100).problem().is_none());
    }

    #[test]
    fn it_reads_and_writes_as_an_integer_or_a_percentage_string() {
        use MaxConcurrentInvasive::*;
        assert_eq!(serde_json::to_string(&Count(4)).unwrap(), "4");
        assert_eq!(serde_json::to_string(&Percent(5)).unwrap(), "\"5%\"");
        assert_eq!(
            serde_json::from_str::<MaxConcurrentInvasive>("4").unwrap(),
            Count(4)
        );
        assert_eq!(
            serde_json::from_str::<MaxConcurrentInvasive>("\"10%\"").unwrap(),
            Percent(10)
        );
        let e = serde_json::from_str::<MaxConcurrentInvasive>("\"4\"").unwrap_err();
        assert!(e.to_string().contains("must be a percentage"), "{e}");
        assert!(serde_json::from_str::<MaxConcurrentInvasive>("-1").is_err());
        assert_eq!(
            serde_json::from_str::<MaxConcurrentInvasive>("null").unwrap(),
            MaxConcurrentInvasive::default()
        );
    }

    #[test]
    fn the_never_certified_go_first_then_the_oldest_certificate() {
        let w = |name: &str, at_: Option<&str>| WaitingNode {
            name: name.into(),
            certified_at: at_.map(at),
        };
        let queue = invasive_queue(
            vec![
                w("fresh", Some("2026-12-07T10:00:00Z")),
                w("old", Some("2026-12-06T10:00:00Z")),
                w("new-b", None),
                w("new-a", None),
                w("older", Some("2026-12-05T10:00:00Z")),
            ],
            4,
        );
        assert_eq!(queue, ["new-a", "new-b", "older", "old"]);
        let s = invasive_status(MaxConcurrentInvasive::Percent(50), 4, vec![w("x", None)]);
        assert_eq!((s.nodes, s.slots, s.waiting, s.queue.len()), (4, 2, 1, 1));
    }

    #[test]
    fn a_node_takes_a_slot_only_in_its_turn_while_the_fleet_keeps_the_queue() {
        let now = at("2026-12-07T12:00:00Z");
        let cap = MaxConcurrentInvasive::Percent(5);
        // No fleet controller: first come, over the fallback slots.
        let t = slot_turn(cap, None, "gpu-1", now);
        assert_eq!((t.slots, t.may_take), (1, true));
        let status = |queue: &[&str], minutes_ago: i64| InvasiveStatus {
            computed_at: Some(Time(now - SignedDuration::from_mins(minutes_ago))),
            nodes: 40,
            slots: 2,
            waiting: 5,
            queue: queue.iter().map(|s| s.to_string()).collect(),
        };
        let full = status(&["gpu-1", "gpu-2"], 1);
        assert!(slot_turn(cap, Some(&full), "gpu-1", now).may_take);
        let behind = slot_turn(cap, Some(&full), "gpu-9", now);
        assert!(!behind.may_take);
        assert!(behind.why_not.unwrap().contains("older certificates"));
        assert_eq!(behind.slots, 2);
        // Room in the queue: the fleet has not seen this node wait yet.
        assert!(slot_turn(cap, Some(&status(&["gpu-1"], 1)), "gpu-9", now).may_take);
        // A stale status is not followed.
        let stale = slot_turn(cap, Some(&status(&["gpu-1", "gpu-2"], 30)), "gpu-9", now);
        assert_eq!((stale.slots, stale.may_take), (1, true));
    }

    #[test]
    fn a_waiting_mark_of_a_dead_prober_stops_counting() {
        let since = at("2026-12-07T12:00:00Z");
        assert!(waiting_mark_counts(since, since + WAITING_RENEW));
        assert!(!waiting_mark_counts(
            since,
            since + WAITING_FRESH + SignedDuration::from_secs(1)
        ));
    }
}
