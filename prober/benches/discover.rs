//! Discovery over the DGX H100 model tree (target: under 20 ms), plus its pure part and the
//! `nvidia-smi topo -m` parser. `cargo bench -p railguard-prober --bench discover`.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use railguard_prober::discover::{analyze, discover, read};
use railguard_sim::{write_sysfs, NodeModel};

fn bench(c: &mut Criterion) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = match NodeModel::load(&manifest.join("models/dgx-h100.yaml")) {
        Ok(m) => m,
        Err(e) => panic!("model: {e}"),
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    if let Err(e) = write_sysfs(&model, dir.path()) {
        panic!("write: {e}");
    }
    let root = dir.path();
    c.bench_function("discover_dgx_h100_tree", |b| {
        b.iter(|| discover(root, false).map(|d| d.rails.len()))
    });
    let inv = match read(root, false) {
        Ok(i) => i,
        Err(e) => panic!("read: {e}"),
    };
    c.bench_function("analyze_dgx_h100_inventory", |b| {
        b.iter(|| analyze(&inv).rails.len())
    });
    let topo = match std::fs::read_to_string(
        manifest.join("fixtures/topo/dgx-h200-layout-12nic-pxb-pix-pairs-tabs.txt"),
    ) {
        Ok(t) => t,
        Err(e) => panic!("fixture: {e}"),
    };
    c.bench_function("topo_parse_and_affinity_h200", |b| {
        b.iter(|| railguard_prober::topo::parse(&topo).map(|t| t.affinity().0.gpus.len()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
