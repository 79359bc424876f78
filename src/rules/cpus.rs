//! Dedicated CPUs (KubeVirt's `dedicatedCpuPlacement` and `isolateEmulatorThread`): which
//! host CPUs an instance's vCPUs (and its emulator thread) are pinned to. The scheduler picks
//! them from the CPUs no other dedicated instance on the node holds and records them on the
//! instance ([`DEDICATED_CPUS_ANNOTATION`]); the agent pins the domain to them.

use std::collections::BTreeSet;

use crate::types::VirtualMachineInstance;
pub use crate::types::annotations::DEDICATED_CPUS_ANNOTATION;

/// The host CPUs of one instance: one per vCPU, in vCPU order, and the emulator thread's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pins {
    pub vcpus: Vec<u32>,
    pub emulator: Option<u32>,
}

impl Pins {
    /// The annotation's form: `vcpus=3,2;emulator=1` (`;emulator=` left out without one).
    pub fn to_annotation(&self) -> String {
        let v: Vec<String> = self.vcpus.iter().map(u32::to_string).collect();
        match self.emulator {
            Some(e) => format!("vcpus={};emulator={e}", v.join(",")),
            None => format!("vcpus={}", v.join(",")),
        }
    }

    pub fn parse(s: &str) -> Option<Pins> {
        let mut vcpus = None;
        let mut emulator = None;
        for part in s.split(';') {
            match part.split_once('=')? {
                ("vcpus", list) => {
                    vcpus = Some(
                        list.split(',')
                            .map(|c| c.parse::<u32>().ok())
                            .collect::<Option<Vec<u32>>>()?,
                    )
                }
                ("emulator", c) => emulator = Some(c.parse().ok()?),
                _ => return None,
            }
        }
        Some(Pins {
            vcpus: vcpus.filter(|v| !v.is_empty())?,
            emulator,
        })
    }

    /// Every host CPU it holds.
    pub fn all(&self) -> impl Iterator<Item = u32> + '_ {
        self.vcpus.iter().copied().chain(self.emulator)
    }

    /// The pins an instance was given, if it has dedicated CPUs and was placed.
    pub fn of(vmi: &VirtualMachineInstance) -> Option<Pins> {
        use crate::types::Meta;
        vmi.annotation(DEDICATED_CPUS_ANNOTATION)
            .and_then(Pins::parse)
    }
}

/// Whether an instance asks for dedicated CPUs; how many vCPUs, and whether its emulator
/// thread wants one too.
pub fn wants(vmi: &VirtualMachineInstance, vcpus: u32) -> Option<(u32, bool)> {
    let cpu = vmi.spec.domain.cpu.as_ref()?;
    (cpu.dedicated_cpu_placement == Some(true))
        .then(|| (vcpus, cpu.isolate_emulator_thread == Some(true)))
}

/// Pick host CPUs for `vcpus` vCPUs (and the emulator thread) on a host with `host_cpus`
/// CPUs, of which `taken` are held by other instances: the highest free ones first, so CPU 0
/// (where the host's own interrupts and daemons mostly run) goes last. `None`: not enough.
pub fn pick(host_cpus: u32, taken: &BTreeSet<u32>, vcpus: u32, emulator: bool) -> Option<Pins> {
    let mut free = (0..host_cpus).rev().filter(|c| !taken.contains(c));
    let v: Vec<u32> = free.by_ref().take(vcpus as usize).collect();
    if v.len() < vcpus as usize || vcpus == 0 {
        return None;
    }
    let e = if emulator { Some(free.next()?) } else { None };
    let mut v = v;
    v.sort_unstable();
    Some(Pins {
        vcpus: v,
        emulator: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_take_free_cpus_from_the_top_and_round_trip() {
        let none = BTreeSet::new();
        let p = pick(4, &none, 2, true).unwrap();
        assert_eq!(
            p,
            Pins {
                vcpus: vec![2, 3],
                emulator: Some(1)
            }
        );
        assert_eq!(Pins::parse(&p.to_annotation()), Some(p.clone()));
        let taken: BTreeSet<u32> = p.all().collect();
        assert_eq!(
            pick(4, &taken, 1, false),
            Some(Pins {
                vcpus: vec![0],
                emulator: None
            })
        );
        assert_eq!(pick(4, &taken, 1, true), None, "one CPU left, two wanted");
        assert_eq!(
            pick(2, &none, 1, true).unwrap().to_annotation(),
            "vcpus=1;emulator=0"
        );
        for bad in [
            "",
            "vcpus=",
            "vcpus=a",
            "cpus=1",
            "vcpus=1;emulator=x",
            "vcpus=1;x=2",
        ] {
            assert_eq!(Pins::parse(bad), None, "{bad:?}");
        }
    }
}
