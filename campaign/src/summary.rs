//! A campaign report's outcome: whether it blamed anything, and its text summary.

use super::coordinator::CampaignReport;

/// Whether the campaign blamed a node, a rail or a link (exit status 1).
pub fn found_faults(r: &CampaignReport) -> bool {
    r.findings
        .values()
        .any(|f| f.blames_node() || !f.links.is_empty())
}

/// A short text summary: counts and the culprits.
pub fn render_summary(r: &CampaignReport) -> String {
    let mut out = format!(
        "campaign {}: {} nodes, {} rails, {} tests in {} rounds\n",
        r.profile,
        r.nodes.len(),
        r.rails.len(),
        r.tests.len(),
        r.rounds
    );
    let mut any = false;
    for f in r.findings.values() {
        if let Some(reason) = &f.node_fault {
            out.push_str(&format!("  node {}: {reason}\n", f.node));
            any = true;
        } else {
            for b in f.blamed_rails.values() {
                out.push_str(&format!("  node {}: {}\n", f.node, b.reason));
                any = true;
            }
        }
        for b in f.nccl_blamed.values() {
            out.push_str(&format!("  node {}: {}\n", f.node, b.reason));
            any = true;
        }
    }
    if let Some(n) = &r.nccl {
        out.push_str(&format!(
            "  NCCL pair tests: {} runs ({} scopes: {}) in {} rounds\n",
            n.runs(),
            n.scopes.len(),
            n.scopes.join(", "),
            n.rounds
        ));
    }
    let mut links: Vec<&String> = r.findings.values().flat_map(|f| f.links.iter()).collect();
    links.sort();
    links.dedup();
    for l in links {
        out.push_str(&format!("  {l}\n"));
        any = true;
    }
    for (node, reason) in &r.refused {
        out.push_str(&format!("  node {node} left out: {reason}\n"));
    }
    for t in r.tests.iter().filter(|t| t.error.is_some()) {
        out.push_str(&format!(
            "  test {}->{}: {}\n",
            t.initiator,
            t.responder,
            t.error.as_deref().unwrap_or_default()
        ));
    }
    if !any {
        out.push_str("  no fault found\n");
    }
    out
}
