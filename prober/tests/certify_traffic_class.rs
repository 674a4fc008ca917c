//! The profile's fabric class reaches every RDMA request certification and campaigns make.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use railguard_campaign::coordinator::CampaignSettings;
use railguard_prober::certify::run::bench_rails;
use railguard_prober::progress::NoProgress;
use railguard_prober::rdma::{
    RailBenchRequest, RailBenchResult, RdmaEngine, RdmaError, TrafficClass,
};

/// Records what it was asked and fails every request (the requests are what is tested).
#[derive(Default)]
struct RecordingEngine {
    asked: Mutex<Vec<RailBenchRequest>>,
}

impl RdmaEngine for RecordingEngine {
    fn loopback(&self, req: &RailBenchRequest) -> Result<RailBenchResult, RdmaError> {
        self.asked.lock().unwrap().push(req.clone());
        Err(RdmaError::NoDevices)
    }
    fn devices(&self) -> Result<Vec<String>, RdmaError> {
        Ok(Vec::new())
    }
}

fn profile() -> railguard_api::FabricProfile {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../api/fixtures/profiles/roce-cloud.yaml"
    );
    let text = std::fs::read_to_string(p).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

#[tokio::test]
async fn certification_and_campaigns_send_in_the_profiles_class() {
    let mut p = profile();
    let engine = Arc::new(RecordingEngine::default());
    bench_rails(engine.clone(), &p.spec, &[], Arc::new(NoProgress)).await;
    let asked = engine.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), p.spec.rails.len());
    assert!(asked.iter().all(|r| r.class == TrafficClass::default()));

    let rdma = p.spec.rdma.as_mut().unwrap();
    rdma.traffic_class = Some(106);
    rdma.service_level = Some(3);
    let want = TrafficClass {
        service_level: 3,
        traffic_class: 106,
    };
    let engine = Arc::new(RecordingEngine::default());
    bench_rails(engine.clone(), &p.spec, &[], Arc::new(NoProgress)).await;
    let asked = engine.asked.lock().unwrap().clone();
    assert!(!asked.is_empty());
    assert!(asked.iter().all(|r| r.class == want), "{asked:?}");

    let settings = CampaignSettings::from_profile(&p, &[7u8; 32]).unwrap();
    assert_eq!(settings.class, want);
}

#[test]
fn a_service_level_beyond_four_bits_is_refused() {
    let req = RailBenchRequest {
        class: TrafficClass {
            service_level: 16,
            traffic_class: 0,
        },
        ..RailBenchRequest::host("mlx5_0", 1)
    };
    let e = req.validate().unwrap_err().to_string();
    assert!(e.contains("service level 16 is not 0-15"), "{e}");
}
