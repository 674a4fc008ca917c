//! Which GID NCCL uses on a RoCE port, so that railguard's RDMA tests run on the same GID
//! and the NCCL node file can say which one was proven.
//!
//! The rule is NCCL's `ncclIbGetGidIndex` and `ncclUpdateGidIndex`
//! (NVIDIA/nccl `src/transport/net_ib/connect.cc`), for the defaults railguard runs NCCL
//! with: `NCCL_IB_GID_INDEX` −1 (choose), `NCCL_IB_ADDR_FAMILY` unset (`AF_INET`),
//! `NCCL_IB_ROCE_VERSION_NUM` 2, no `NCCL_IB_ADDR_RANGE`. Starting at index 0, every later
//! index is a candidate that replaces the current choice when
//! - its address family differs from the current one's and is the wanted family, or
//! - it is of the wanted family, a configured non-link-local GID, of the wanted RoCE
//!   version, and the current one is of another version or is not such a GID.
//!
//! Families as NCCL's `getGidAddrFamily`: IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-mapped
//! multicast (`ff0e::ffff:a.b.c.d`) GIDs are `AF_INET`, every other is `AF_INET6` (the all-zero
//! GID of an unused slot included). "Configured": not all zero and not the bare `fe80::`;
//! link-local: `fe80::/64` (`configuredGid`, `linkLocalGid`). The RoCE version is the kernel's
//! `gid_attrs/types/<i>` (`IB/RoCE v1` or `RoCE v1` → 1, `RoCE v2` → 2), read as NCCL's
//! `ncclIbRoceGetVersionNum` does; an unreadable type matches no version.
//!
//! On mlx5 every address has a RoCE v1 entry followed by a RoCE v2 entry, link-local first
//! (`../shared/fixtures/ibv_devinfo/`), so the choice is the v2 entry of the first IPv4
//! address, never the v1 entry before it.
//!
//! InfiniBand ports are not chosen here: NCCL uses index 0 there (or
//! `NCCL_IB_ROUTABLE_FLID_GID_INDEX`, 1, when that GID carries a routable FLID) and never
//! reads `NCCL_IB_GID_INDEX` for them.

use super::fabric::{GidEntry, GidType};

/// One slot of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidSlot {
    pub gid: [u8; 16],
    /// RoCE version of the slot (`gid_attrs/types/<i>`); `None` when unreadable.
    pub roce_version: Option<u8>,
}

impl GidSlot {
    /// An unused slot: the all-zero GID.
    pub const UNUSED: GidSlot = GidSlot {
        gid: [0; 16],
        roce_version: None,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Inet,
    Inet6,
}

fn family(gid: &[u8; 16]) -> Family {
    let v4_mapped = gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff];
    let v4_mapped_multicast =
        gid[..4] == [0xff, 0x0e, 0, 0] && gid[4..10] == [0; 6] && gid[10..12] == [0xff, 0xff];
    if v4_mapped || v4_mapped_multicast {
        Family::Inet
    } else {
        Family::Inet6
    }
}

fn configured(gid: &[u8; 16]) -> bool {
    let trailer_zero = gid[4..] == [0; 12];
    let head = &gid[..4];
    !(trailer_zero && (head == [0; 4] || head == [0xfe, 0x80, 0, 0]))
}

fn link_local(gid: &[u8; 16]) -> bool {
    gid[..4] == [0xfe, 0x80, 0, 0] && gid[4..8] == [0; 4]
}

fn valid(gid: &[u8; 16]) -> bool {
    configured(gid) && !link_local(gid)
}

/// A port's table from its used entries as discovery read them (`gids/<i>`,
/// `gid_attrs/types/<i>`), unused slots between them all zero. `None` when a GID is junk: the
/// choice would be a guess.
pub fn table_of(entries: &[GidEntry]) -> Option<Vec<GidSlot>> {
    let mut table = Vec::new();
    for e in entries {
        let gid = parse_sysfs_gid(e.gid.value()?)?;
        let at = usize::try_from(e.index).ok()?;
        if at < table.len() {
            return None;
        }
        table.resize(at, GidSlot::UNUSED);
        table.push(GidSlot {
            gid,
            roce_version: match e.gid_type.value() {
                Some(GidType::IbRoceV1) => Some(1),
                Some(GidType::RoceV2) => Some(2),
                None => None,
            },
        });
    }
    Some(table)
}

/// The RoCE version NCCL wants by default (`NCCL_IB_ROCE_VERSION_NUM`).
pub const NCCL_ROCE_VERSION: u8 = 2;

/// Pure: the GID index NCCL chooses on a RoCE port whose GID table is `table` (slot `i` at
/// position `i`), with NCCL's defaults (see the module). `None` for an empty table.
pub fn nccl_roce_gid_index(table: &[GidSlot]) -> Option<u32> {
    let wanted = Family::Inet;
    let first = table.first()?;
    let mut chosen = (0usize, first);
    for (i, cand) in table.iter().enumerate().skip(1) {
        let (cur_family, cand_family) = (family(&chosen.1.gid), family(&cand.gid));
        // No NCCL_IB_ADDR_RANGE: every candidate "matches the subnet".
        if cand_family != cur_family && cand_family == wanted {
            chosen = (i, cand);
            continue;
        }
        if cand_family != wanted || !valid(&cand.gid) {
            continue;
        }
        if (chosen.1.roce_version != cand.roce_version || !valid(&chosen.1.gid))
            && cand.roce_version == Some(NCCL_ROCE_VERSION)
        {
            chosen = (i, cand);
        }
    }
    u32::try_from(chosen.0).ok()
}

/// The kernel's GID text (`fe80:0000:0000:0000:0202:c9ff:fe00:0001`, eight groups of four
/// hex digits) as bytes; `None` for anything else.
pub fn parse_sysfs_gid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        if g.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

/// `gid_attrs/types/<i>` as NCCL reads it: `IB/RoCE v1` and `RoCE v1` are 1, `RoCE v2` is 2.
pub fn roce_version_of_type(text: &str) -> Option<u8> {
    let t = text.trim_start();
    if t.starts_with("IB/RoCE v1") || t.starts_with("RoCE v1") {
        Some(1)
    } else if t.starts_with("RoCE v2") {
        Some(2)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(text: &str, version: u8) -> GidSlot {
        GidSlot {
            gid: parse_sysfs_gid(text).unwrap_or_else(|| panic!("{text}")),
            roce_version: Some(version),
        }
    }

    const LINK_LOCAL: &str = "fe80:0000:0000:0000:0202:c9ff:fe00:0001";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0001";
    const V4_B: &str = "0000:0000:0000:0000:0000:ffff:0a01:0001";
    const V6: &str = "fd00:0000:0000:0000:0000:0000:0000:0001";

    /// mlx5's table: v1 then v2 for the link-local address, then for the IPv4 address.
    #[test]
    fn mlx5s_table_gives_the_v2_entry_of_the_ipv4_address() {
        let table = [
            slot(LINK_LOCAL, 1),
            slot(LINK_LOCAL, 2),
            slot(V4, 1),
            slot(V4, 2),
        ];
        assert_eq!(nccl_roce_gid_index(&table), Some(3));
        // Two addresses: the first address's v2 entry (a later v2 of the same family and
        // version does not replace it).
        let two = [
            slot(LINK_LOCAL, 1),
            slot(LINK_LOCAL, 2),
            slot(V4, 1),
            slot(V4, 2),
            slot(V4_B, 1),
            slot(V4_B, 2),
        ];
        assert_eq!(nccl_roce_gid_index(&two), Some(3));
    }

    #[test]
    fn soft_roce_v2_only_and_ipv6_only_tables() {
        // rxe: v2 entries only.
        assert_eq!(
            nccl_roce_gid_index(&[slot(LINK_LOCAL, 2), slot(V4, 2)]),
            Some(1)
        );
        // No IPv4 address: NCCL (AF_INET) stays at index 0, whatever comes later.
        assert_eq!(
            nccl_roce_gid_index(&[slot(LINK_LOCAL, 1), slot(LINK_LOCAL, 2), slot(V6, 2)]),
            Some(0)
        );
        // Only a v1 IPv4 entry: taken for its family (the first rule), v2 or not.
        assert_eq!(
            nccl_roce_gid_index(&[slot(LINK_LOCAL, 1), slot(V4, 1)]),
            Some(1)
        );
        assert_eq!(nccl_roce_gid_index(&[]), None);
    }

    #[test]
    fn unused_slots_and_unreadable_types_are_not_chosen() {
        let table = [
            slot(LINK_LOCAL, 1),
            GidSlot::UNUSED,
            slot(V4, 1),
            GidSlot {
                roce_version: None,
                ..slot(V4, 2)
            },
            GidSlot::UNUSED,
        ];
        assert_eq!(nccl_roce_gid_index(&table), Some(2));
    }

    #[test]
    fn families_and_validity_as_nccl_reads_them() {
        let g = |t: &str| parse_sysfs_gid(t).unwrap_or_default();
        assert_eq!(family(&g(V4)), Family::Inet);
        assert_eq!(
            family(&g("ff0e:0000:0000:0000:0000:ffff:e000:0001")),
            Family::Inet
        );
        assert_eq!(family(&g(LINK_LOCAL)), Family::Inet6);
        assert_eq!(family(&[0; 16]), Family::Inet6);
        assert!(valid(&g(V4)) && valid(&g(V6)));
        assert!(!valid(&g(LINK_LOCAL)) && !valid(&[0; 16]));
        assert!(!configured(&g("fe80:0000:0000:0000:0000:0000:0000:0000")));
    }

    /// A real ConnectX-7 RoCE port's table (`show_gids`, fixture with its source): NCCL's
    /// choice is index 3, the RoCE v2 entry of 10.99.91.39, as the operator's notes say.
    #[test]
    fn a_real_cx7_show_gids_table_gives_index_3() {
        let text = include_str!("../../fixtures/gids/cx7-roce-ibv_devinfo-show_gids.txt");
        let mut table = Vec::new();
        for line in text.lines().filter(|l| l.starts_with("mlx5_0\t")) {
            let cols: Vec<&str> = line.split('\t').filter(|c| !c.trim().is_empty()).collect();
            let (index, gid, version) = (cols[2], cols[3], cols[cols.len() - 2]);
            assert_eq!(index.parse::<usize>().ok(), Some(table.len()), "{line}");
            table.push(GidSlot {
                gid: parse_sysfs_gid(gid).unwrap_or_else(|| panic!("{line}")),
                roce_version: roce_version_of_type(&format!("RoCE {version}")),
            });
        }
        assert_eq!(table.len(), 4);
        assert_eq!(nccl_roce_gid_index(&table), Some(3));
    }

    #[test]
    fn discoverys_entries_become_the_positional_table() {
        use super::super::attr::Attr;
        let e = |index: u32, gid: &str, t: GidType| GidEntry {
            index,
            gid: Attr::Value(gid.into()),
            gid_type: Attr::Value(t),
            ndev: Attr::Value("eth2".into()),
        };
        // Slot 1 unused (left out by discovery): the table keeps positions.
        let entries = [
            e(0, LINK_LOCAL, GidType::IbRoceV1),
            e(2, V4, GidType::IbRoceV1),
            e(3, V4, GidType::RoceV2),
        ];
        let table = table_of(&entries).unwrap_or_default();
        assert_eq!(table.len(), 4);
        assert_eq!(table[1], GidSlot::UNUSED);
        assert_eq!(nccl_roce_gid_index(&table), Some(3));
        let junk = [GidEntry {
            gid: Attr::Junk("zz".into()),
            ..e(0, LINK_LOCAL, GidType::RoceV2)
        }];
        assert_eq!(table_of(&junk), None);
    }

    #[test]
    fn sysfs_text() {
        assert_eq!(roce_version_of_type("IB/RoCE v1\n"), Some(1));
        assert_eq!(roce_version_of_type("RoCE v1"), Some(1));
        assert_eq!(roce_version_of_type("RoCE v2\n"), Some(2));
        assert_eq!(roce_version_of_type("v3"), None);
        for bad in [
            "",
            "fe80::1",
            "fe80:0000:0000:0000:0202:c9ff:fe00",
            "zzzz:0000:0000:0000:0000:0000:0000:0000",
        ] {
            assert_eq!(parse_sysfs_gid(bad), None, "{bad}");
        }
    }
}
