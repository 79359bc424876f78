//! Host CPU facts from `/proc/cpuinfo`: vendor (`GenuineIntel`, `AuthenticAMD`,
//! `HygonGenuine`), model name, logical CPU count.

use crate::types::edgevirt::CpuFacts;

/// Parse the text of `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> CpuFacts {
    let mut f = CpuFacts::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "vendor_id" if f.vendor.is_empty() => f.vendor = v.trim().to_string(),
            "model name" if f.model.is_empty() => f.model = v.trim().to_string(),
            "processor" => f.count += 1,
            _ => {}
        }
    }
    f
}

pub fn host_cpu() -> CpuFacts {
    parse_cpuinfo(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #[test]
    fn hygon() {
        let t = "processor\t: 0\nvendor_id\t: HygonGenuine\nmodel name\t: Hygon C86 7285 32-core Processor\n\nprocessor\t: 1\nvendor_id\t: HygonGenuine\n";
        let f = super::parse_cpuinfo(t);
        assert_eq!((f.vendor.as_str(), f.count), ("HygonGenuine", 2));
        assert!(f.model.starts_with("Hygon C86"));
    }
}
