//! Every saved `nvidia-smi topo -m` in fixtures/topo (copied from shared/fixtures, source
//! line kept) parsed into its expected affinity map.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use railguard_api::PathType;
use railguard_prober::discover::NicRole;
use railguard_prober::topo::{parse, TopoError};

fn fixture(name: &str) -> String {
    let path = format!("{}/fixtures/topo/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// (preferred hca, path, numa, alternates)
type Row<'a> = (&'a str, PathType, Option<u32>, Vec<&'a str>);

fn check(name: &str, expected: &[Row<'_>], storage: &[&str]) {
    let text = fixture(name);
    assert!(
        text.starts_with("# source: "),
        "{name} lost its source line"
    );
    let topo = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (map, _findings) = topo.affinity();
    assert_eq!(map.gpus.len(), expected.len(), "{name}: GPU count");
    for (i, (entry, (hca, path, numa, alts))) in map.gpus.iter().zip(expected).enumerate() {
        assert_eq!(entry.index as usize, i);
        let p = entry
            .preferred
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: GPU{i} has no NIC"));
        assert_eq!(
            (p.hca.as_str(), p.path),
            (*hca, *path),
            "{name}: GPU{i} preferred"
        );
        assert_eq!(p.port, None, "topo -m does not know ports");
        assert_eq!(entry.numa, *numa, "{name}: GPU{i} numa");
        let got: Vec<&str> = entry.alternates.iter().map(|a| a.hca.as_str()).collect();
        assert_eq!(&got, alts, "{name}: GPU{i} alternates");
    }
    let roles = topo.nic_roles();
    let got_storage: Vec<&str> = topo
        .nics
        .iter()
        .zip(&roles)
        .filter(|(_, r)| **r == NicRole::Storage)
        .map(|(n, _)| n.name.as_str())
        .collect();
    assert_eq!(got_storage, storage, "{name}: storage NICs");
}

#[test]
fn dgx_h200_twelve_nics_pxb_with_storage_pairs() {
    use PathType::*;
    let s0 = vec!["mlx5_3", "mlx5_4", "mlx5_5"];
    let row = |h, alts: Vec<&'static str>, numa| (h, Pxb, Some(numa), alts);
    let expected = vec![
        row("mlx5_0", s0.clone(), 0),
        row("mlx5_3", vec!["mlx5_0", "mlx5_4", "mlx5_5"], 0),
        row("mlx5_4", vec!["mlx5_0", "mlx5_3", "mlx5_5"], 0),
        row("mlx5_5", vec!["mlx5_0", "mlx5_3", "mlx5_4"], 0),
        row("mlx5_6", vec!["mlx5_9", "mlx5_10", "mlx5_11"], 1),
        row("mlx5_9", vec!["mlx5_6", "mlx5_10", "mlx5_11"], 1),
        row("mlx5_10", vec!["mlx5_6", "mlx5_9", "mlx5_11"], 1),
        row("mlx5_11", vec!["mlx5_6", "mlx5_9", "mlx5_10"], 1),
    ];
    check(
        "dgx-h200-layout-12nic-pxb-pix-pairs-tabs.txt",
        &expected,
        &["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"],
    );
}

#[test]
fn gcp_a4_pix_pairs_get_distinct_rails() {
    use PathType::*;
    // Each GPU pair shares a NIC pair at PIX: the tie-break gives every GPU its own NIC and
    // the pair partner as alternate. The published NUMA column is collapsed ("0 N/A").
    let expected: Vec<Row<'_>> = vec![
        ("mlx5_0", Pix, Some(0), vec!["mlx5_1"]),
        ("mlx5_1", Pix, Some(0), vec!["mlx5_0"]),
        ("mlx5_2", Pix, Some(0), vec!["mlx5_3"]),
        ("mlx5_3", Pix, Some(0), vec!["mlx5_2"]),
        ("mlx5_4", Pix, Some(1), vec!["mlx5_5"]),
        ("mlx5_5", Pix, Some(1), vec!["mlx5_4"]),
        ("mlx5_6", Pix, Some(1), vec!["mlx5_7"]),
        ("mlx5_7", Pix, Some(1), vec!["mlx5_6"]),
    ];
    check("gcp-a4-b200-8nic-roce-pix-pairs.txt", &expected, &[]);
}

#[test]
fn hgx_h100_roce_single_numa_skips_bond_and_down_nics() {
    use PathType::*;
    let compute = [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_11",
    ];
    let expected: Vec<Row<'_>> = compute
        .iter()
        .map(|h| {
            let alts = compute.iter().copied().filter(|a| a != h).collect();
            (*h, Pix, Some(0), alts)
        })
        .collect();
    check(
        "hgx-h100-roce400-12nic-single-numa.txt",
        &expected,
        &["mlx5_3", "mlx5_4", "mlx5_9", "mlx5_10"],
    );
}

#[test]
fn every_fixture_cut_in_half_is_a_clear_error() {
    for name in [
        "dgx-h200-layout-12nic-pxb-pix-pairs-tabs.txt",
        "gcp-a4-b200-8nic-roce-pix-pairs.txt",
        "hgx-h100-roce400-12nic-single-numa.txt",
    ] {
        let text = fixture(name);
        // Cut at many points, including mid-line and mid-legend: never a panic, and every
        // cut that loses a GPU row or a legend entry is an error naming what is missing.
        for frac in [0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9] {
            let mut cut = (text.len() as f64 * frac) as usize;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            match parse(&text[..cut]) {
                Err(TopoError::NoHeader) | Err(TopoError::Incomplete(_)) => {}
                other => panic!("{name} cut at {frac}: {other:?}"),
            }
        }
        let half = parse(&text[..text.len() / 2]).expect_err("half a matrix must not parse");
        assert!(!half.to_string().is_empty());
    }
}

#[test]
fn trailing_whitespace_and_spaces_instead_of_tabs_parse_the_same() {
    let text = fixture("dgx-h200-layout-12nic-pxb-pix-pairs-tabs.txt");
    let spaced: String = text
        .lines()
        .map(|l| format!("{}   \n", l.replace('\t', "    ")))
        .collect();
    let a = parse(&text).expect("tabs");
    let b = parse(&spaced).expect("spaces");
    assert_eq!(a.affinity().0, b.affinity().0);
    assert_eq!(b.gpus[4].cpu_affinity.as_deref(), Some("56-111,168-223"));
}
