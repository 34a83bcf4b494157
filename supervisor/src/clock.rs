//! CLOCK_MONOTONIC in nanoseconds: the clock the runtime uses for
//! `heartbeat_ns`, `t_ns` and `t_detect_ns`, so both sides compare directly.

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

pub fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

pub fn us(ns: u64) -> u64 {
    ns / 1_000
}

/// Wall clock, seconds since the epoch (for metrics).
pub fn unix_secs_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
