//! Events railguard records: one way to write them, for the prober, the fleet controller and
//! the profile catalog ([`NodeEvent::to_event`] builds the object).

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::api::{Api, PostParams};
use kube::Client;
use railguard_api::node::{NodeEvent, EVENT_NAMESPACE};

/// Records `ev` about `involved`, reported by `component` from `instance`.
pub async fn record_event(
    client: &Client,
    involved: ObjectReference,
    ev: &NodeEvent,
    component: &str,
    instance: &str,
) -> Result<(), kube::Error> {
    let event = ev.to_event(
        involved,
        component,
        instance,
        k8s_openapi::jiff::Timestamp::now(),
    );
    Api::<Event>::namespaced(client.clone(), EVENT_NAMESPACE)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}
