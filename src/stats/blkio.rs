//! A cgroup's per-device block I/O, as cAdvisor gets it through
//! libcontainer (v1: the blkio files of `fs/blkio.go`, tried in its order;
//! v2: `io.stat` as `fs2/io.go` maps it) and shows it in its
//! `container_fs_*` and `container_blkio_device_usage_total` families.

use std::collections::HashMap;
use std::path::Path;

use super::cgroup::FileReader;

/// The operations v1's blkio files name, as libcontainer keeps them;
/// `Count` for files without one (sectors, time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Read,
    Write,
    Sync,
    Async,
    Discard,
    Total,
    Count,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "Read",
            Op::Write => "Write",
            Op::Sync => "Sync",
            Op::Async => "Async",
            Op::Discard => "Discard",
            Op::Total => "Total",
            Op::Count => "Count",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "Read" => Op::Read,
            "Write" => Op::Write,
            "Sync" => Op::Sync,
            "Async" => Op::Async,
            "Discard" => Op::Discard,
            "Total" => Op::Total,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskEntry {
    pub major: u32,
    pub minor: u32,
    pub op: Op,
    pub value: u64,
}

/// cAdvisor's `DiskIoStats` tables that its Prometheus families read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiskIo {
    pub service_bytes: Vec<DiskEntry>,
    pub serviced: Vec<DiskEntry>,
    pub queued: Vec<DiskEntry>,
    pub sectors: Vec<DiskEntry>,
    pub service_time: Vec<DiskEntry>,
    pub merged: Vec<DiskEntry>,
}

impl DiskIo {
    pub fn is_empty(&self) -> bool {
        self.service_bytes.is_empty()
            && self.serviced.is_empty()
            && self.queued.is_empty()
            && self.sectors.is_empty()
            && self.service_time.is_empty()
            && self.merged.is_empty()
    }

    fn table(&mut self, t: Table) -> Option<&mut Vec<DiskEntry>> {
        Some(match t {
            Table::ServiceBytes => &mut self.service_bytes,
            Table::Serviced => &mut self.serviced,
            Table::Queued => &mut self.queued,
            Table::Sectors => &mut self.sectors,
            Table::ServiceTime => &mut self.service_time,
            Table::Merged => &mut self.merged,
            Table::Unused => return None,
        })
    }
}

/// A block device's major:minor.
pub type DevNum = (u32, u32);

/// Block device names by major:minor.
pub type DiskNames = HashMap<DevNum, String>;

/// One device's values in a table, by operation.
pub type PerDisk = (DevNum, Vec<(Op, u64)>);

/// A table's values per device (cAdvisor's `PerDiskStats`: entries merged
/// by major:minor).
pub fn per_device(table: &[DiskEntry]) -> Vec<PerDisk> {
    let mut out: Vec<PerDisk> = Vec::new();
    for e in table {
        let key = (e.major, e.minor);
        let ops = match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ops)) => ops,
            None => {
                out.push((key, Vec::new()));
                &mut out.last_mut().expect("just pushed").1
            }
        };
        // A later line for the same operation wins, as in cAdvisor's map.
        match ops.iter_mut().find(|(o, _)| *o == e.op) {
            Some(slot) => slot.1 = e.value,
            None => ops.push((e.op, e.value)),
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Table {
    ServiceBytes,
    Serviced,
    Queued,
    Sectors,
    ServiceTime,
    Merged,
    /// Read by libcontainer but shown in no family (wait and io time).
    Unused,
}

/// libcontainer's v1 file groups in its order: bfq with debug stats, bfq,
/// cfq, throttle (recursive), throttle. The first group whose first file
/// has entries is read; files of tables no family shows are skipped.
const V1_GROUPS: [&[(&str, Table)]; 5] = [
    &[
        ("blkio.bfq.sectors_recursive", Table::Sectors),
        ("blkio.bfq.io_service_time_recursive", Table::ServiceTime),
        ("blkio.bfq.io_wait_time_recursive", Table::Unused),
        ("blkio.bfq.io_merged_recursive", Table::Merged),
        ("blkio.bfq.io_queued_recursive", Table::Queued),
        ("blkio.bfq.time_recursive", Table::Unused),
        ("blkio.bfq.io_serviced_recursive", Table::Serviced),
        ("blkio.bfq.io_service_bytes_recursive", Table::ServiceBytes),
    ],
    &[
        ("blkio.bfq.io_serviced_recursive", Table::Serviced),
        ("blkio.bfq.io_service_bytes_recursive", Table::ServiceBytes),
    ],
    &[
        ("blkio.sectors_recursive", Table::Sectors),
        ("blkio.io_service_time_recursive", Table::ServiceTime),
        ("blkio.io_wait_time_recursive", Table::Unused),
        ("blkio.io_merged_recursive", Table::Merged),
        ("blkio.io_queued_recursive", Table::Queued),
        ("blkio.time_recursive", Table::Unused),
        ("blkio.io_serviced_recursive", Table::Serviced),
        ("blkio.io_service_bytes_recursive", Table::ServiceBytes),
    ],
    &[
        ("blkio.throttle.io_serviced_recursive", Table::Serviced),
        (
            "blkio.throttle.io_service_bytes_recursive",
            Table::ServiceBytes,
        ),
    ],
    &[
        ("blkio.throttle.io_serviced", Table::Serviced),
        ("blkio.throttle.io_service_bytes", Table::ServiceBytes),
    ],
];

/// Which groups' first files the blkio hierarchy has (the kernel's
/// configuration and I/O schedulers decide, the same in every cgroup), so
/// a collection does not try missing files in each of hundreds of cgroups.
#[derive(Debug, Clone, Copy, Default)]
pub struct V1Files {
    present: [bool; 5],
}

impl V1Files {
    pub fn probe(blkio_root: &Path) -> Self {
        let mut present = [false; 5];
        for (p, g) in present.iter_mut().zip(V1_GROUPS) {
            *p = blkio_root.join(g[0].0).exists();
        }
        V1Files { present }
    }
}

/// Reads a v1 cgroup's blkio directory `d`.
pub fn read_v1(d: &Path, files: V1Files, r: &mut FileReader) -> DiskIo {
    let mut io = DiskIo::default();
    for (gi, group) in V1_GROUPS.iter().enumerate() {
        if !files.present[gi] {
            continue;
        }
        // A cgroup's recursive figures hold all of its subtree's: under a
        // cgroup whose were empty (read earlier in this collection, as the
        // hierarchy is read from the root down) there is nothing to read.
        let recursive = gi < 4;
        let known_empty = recursive
            && r.blkio_empty
                .iter()
                .any(|(p, g)| *g == gi && d.starts_with(p));
        let first = if known_empty {
            Vec::new()
        } else {
            r.whole(d, group[0].0).map(parse_v1).unwrap_or_default()
        };
        if first.is_empty() {
            if recursive && !known_empty {
                r.blkio_empty.push((d.to_path_buf(), gi));
            }
            // The recursive throttle file counts this cgroup's own I/O
            // too, so when it is there and empty the plain one is empty
            // as well: libcontainer's last try would find nothing.
            if gi == 3 {
                break;
            }
            continue;
        }
        if let Some(t) = io.table(group[0].1) {
            *t = first;
        }
        for (name, table) in &group[1..] {
            if matches!(table, Table::Unused) {
                continue;
            }
            let entries = r.whole(d, name).map(parse_v1).unwrap_or_default();
            // libcontainer stops at a later file that is missing or empty,
            // keeping the tables read before it.
            if entries.is_empty() {
                break;
            }
            if let Some(t) = io.table(*table) {
                *t = entries;
            }
        }
        break;
    }
    io
}

/// `MAJ:MIN Op value` or `MAJ:MIN value` lines; the closing `Total n`
/// line is skipped, as are lines libcontainer would refuse.
fn parse_v1(text: &str) -> Vec<DiskEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(a)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((major, minor)) = dev_numbers(dev) else {
            continue;
        };
        let (op, v) = match f.next() {
            Some(v) => match Op::parse(a) {
                Some(op) => (op, v),
                None => continue,
            },
            None => (Op::Count, a),
        };
        let Ok(value) = v.parse() else { continue };
        out.push(DiskEntry {
            major,
            minor,
            op,
            value,
        });
    }
    out
}

fn dev_numbers(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// v2's `io.stat`: `MAJ:MIN rbytes=.. wbytes=.. rios=.. wios=.. ...`;
/// bytes and I/O counts map to v1's service bytes and serviced tables, the
/// rest is left out as libcontainer leaves it.
pub fn parse_v2(text: &str) -> DiskIo {
    let mut io = DiskIo::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some((major, minor)) = f.next().and_then(dev_numbers) else {
            continue;
        };
        for kv in f {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let (table, op) = match k {
                "rbytes" => (&mut io.service_bytes, Op::Read),
                "wbytes" => (&mut io.service_bytes, Op::Write),
                "rios" => (&mut io.serviced, Op::Read),
                "wios" => (&mut io.serviced, Op::Write),
                _ => continue,
            };
            let Ok(value) = v.parse() else { continue };
            table.push(DiskEntry {
                major,
                minor,
                op,
                value,
            });
        }
    }
    io
}

/// Block device names by major:minor (cAdvisor's machine `DiskMap`, whose
/// entries label per-device figures as `/dev/<name>`): the devices under
/// /sys/block but loop, ram and sr devices and hidden ones (multipath
/// NVMe paths).
pub fn disk_names(sys_block: &Path) -> DiskNames {
    let mut out = HashMap::new();
    let Ok(rd) = std::fs::read_dir(sys_block) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["loop", "ram", "sr"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let dir = e.path();
        let hidden = std::fs::read_to_string(dir.join("hidden"))
            .map(|t| t.trim() == "1")
            .unwrap_or(false);
        if hidden {
            continue;
        }
        if let Some(nums) = std::fs::read_to_string(dir.join("dev"))
            .ok()
            .and_then(|t| dev_numbers(t.trim()))
        {
            out.insert(nums, format!("/dev/{name}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn v1_takes_the_first_group_with_entries_in_libcontainers_order() {
        let root = crate::testutil::tempdir("blkio-v1");
        let cg = root.join("kubepods/pod1/c1");
        let empty = "Total 0\n";
        // bfq files there but empty (the disk uses another scheduler);
        // throttle files have the figures.
        for d in [&root, &cg] {
            write(d, "blkio.bfq.io_serviced_recursive", empty);
            write(d, "blkio.bfq.io_service_bytes_recursive", empty);
            write(d, "blkio.throttle.io_serviced", empty);
            write(d, "blkio.throttle.io_service_bytes", empty);
        }
        write(&root, "blkio.throttle.io_serviced_recursive", empty);
        write(&root, "blkio.throttle.io_service_bytes_recursive", empty);
        write(
            &cg,
            "blkio.throttle.io_serviced_recursive",
            "8:0 Read 12\n8:0 Write 3\n8:0 Sync 3\n8:0 Async 12\n8:0 Discard 0\n8:0 Total 15\nTotal 15\n",
        );
        write(
            &cg,
            "blkio.throttle.io_service_bytes_recursive",
            "8:0 Read 4096\n8:0 Write 8192\n8:0 Total 12288\n253:1 Read 1\nTotal 12289\n",
        );
        let files = V1Files::probe(&root);
        let mut r = FileReader::new();
        let io = read_v1(&cg, files, &mut r);
        let bytes = per_device(&io.service_bytes);
        assert_eq!(
            bytes,
            vec![
                (
                    (8, 0),
                    vec![(Op::Read, 4096), (Op::Write, 8192), (Op::Total, 12288)]
                ),
                ((253, 1), vec![(Op::Read, 1)]),
            ]
        );
        assert_eq!(per_device(&io.serviced)[0].1[0], (Op::Read, 12));
        assert!(io.sectors.is_empty() && io.queued.is_empty());
        // An idle cgroup: nothing, and the plain throttle files (a subset
        // of the recursive ones) are not read.
        let idle = root.join("kubepods/pod1/c2");
        write(&idle, "blkio.bfq.io_serviced_recursive", empty);
        write(&idle, "blkio.throttle.io_serviced_recursive", empty);
        write(&idle, "blkio.throttle.io_serviced", "8:0 Read 1\n");
        write(&idle, "blkio.throttle.io_service_bytes", "8:0 Read 1\n");
        let before = r.opened;
        assert!(read_v1(&idle, files, &mut r).is_empty());
        assert_eq!(r.opened - before, 2, "bfq and throttle-recursive only");
        // Under a cgroup whose recursive files were empty in this
        // collection, nothing is read: they cover the whole subtree.
        r.begin();
        let pod = root.join("kubepods/pod1");
        write(&pod, "blkio.bfq.io_serviced_recursive", empty);
        write(&pod, "blkio.throttle.io_serviced_recursive", empty);
        assert!(read_v1(&pod, files, &mut r).is_empty());
        let before = r.opened;
        assert!(read_v1(&cg, files, &mut r).is_empty());
        assert_eq!(r.opened, before);
        // A new collection reads again.
        r.begin();
        assert!(!read_v1(&cg, files, &mut r).is_empty());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn v1_cfq_files_fill_every_table_and_counts_have_no_operation() {
        let root = crate::testutil::tempdir("blkio-cfq");
        for (f, t) in [
            ("blkio.sectors_recursive", "8:0 16\n"),
            (
                "blkio.io_service_time_recursive",
                "8:0 Read 2000000000\nTotal 2000000000\n",
            ),
            ("blkio.io_merged_recursive", "8:0 Write 4\n"),
            ("blkio.io_queued_recursive", "8:0 Total 1\n"),
            ("blkio.io_serviced_recursive", "8:0 Read 2\n"),
            ("blkio.io_service_bytes_recursive", "8:0 Read 8192\n"),
        ] {
            write(&root, f, t);
        }
        let io = read_v1(&root, V1Files::probe(&root), &mut FileReader::new());
        assert_eq!(
            per_device(&io.sectors),
            vec![((8, 0), vec![(Op::Count, 16)])]
        );
        assert_eq!(
            per_device(&io.service_time)[0].1,
            vec![(Op::Read, 2_000_000_000)]
        );
        assert_eq!(per_device(&io.merged)[0].1, vec![(Op::Write, 4)]);
        assert_eq!(per_device(&io.queued)[0].1, vec![(Op::Total, 1)]);
        assert_eq!(per_device(&io.serviced)[0].1, vec![(Op::Read, 2)]);
        assert_eq!(per_device(&io.service_bytes)[0].1, vec![(Op::Read, 8192)]);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn v2_io_stat_maps_bytes_and_ios_and_drops_the_rest() {
        let io = parse_v2(
            "8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0\n\
             254:0 rbytes=7 wbytes=0 rios=1 wios=0 dbytes=0 dios=0 cost.usage=5\n",
        );
        assert_eq!(
            per_device(&io.service_bytes),
            vec![
                ((8, 16), vec![(Op::Read, 1459200), (Op::Write, 314773504)]),
                ((254, 0), vec![(Op::Read, 7), (Op::Write, 0)]),
            ]
        );
        assert_eq!(
            per_device(&io.serviced)[0].1,
            vec![(Op::Read, 192), (Op::Write, 353)]
        );
        assert!(io.sectors.is_empty() && io.merged.is_empty());
    }

    #[test]
    fn disk_names_skip_loop_ram_sr_and_hidden_devices() {
        let root = crate::testutil::tempdir("sysblock");
        for (n, dev, hidden) in [
            ("vda", "254:0", false),
            ("loop0", "7:0", false),
            ("ram0", "1:0", false),
            ("sr0", "11:0", false),
            ("nvme0c0n1", "259:1", true),
            ("nvme0n1", "259:0", false),
        ] {
            write(&root.join(n), "dev", &format!("{dev}\n"));
            if hidden {
                write(&root.join(n), "hidden", "1\n");
            }
        }
        let names = disk_names(&root);
        assert_eq!(names.len(), 2);
        assert_eq!(names[&(254, 0)], "/dev/vda");
        assert_eq!(names[&(259, 0)], "/dev/nvme0n1");
        let _ = std::fs::remove_dir_all(root);
    }
}
