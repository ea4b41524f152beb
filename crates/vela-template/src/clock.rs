//! The clock behind the `strftime_now(fmt)` template global, and a C-locale `strftime`.
//!
//! HF calls `datetime.now().strftime(fmt)`. The default [`Clock`] reads the system time as UTC
//! (no time-zone database); tests inject a fixed clock so output is deterministic.

use std::sync::Arc;

/// A civil (naive) date-time, as Python's `datetime` without tzinfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    pub year: i32,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

/// Source of "now" for `strftime_now`.
pub type Clock = Arc<dyn Fn() -> DateTime + Send + Sync>;

/// The default clock: current system time in UTC.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        DateTime::from_unix(secs)
    })
}

/// A clock that always returns `dt`.
pub fn fixed_clock(dt: DateTime) -> Clock {
    Arc::new(move || dt)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y as i64 - 1 } else { y as i64 };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn is_leap(y: i32) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

impl DateTime {
    /// UTC civil time of a Unix timestamp (inverse of `days_from_civil`).
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86400);
        let rem = secs.rem_euclid(86400);
        let z = days + 719468;
        let era = if z >= 0 { z } else { z - 146096 } / 146097;
        let doe = z - era * 146097;
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// 0 = Monday .. 6 = Sunday (Python's `weekday()`).
    pub fn weekday(&self) -> usize {
        // 1970-01-01 was a Thursday (3).
        (days_from_civil(self.year, self.month, self.day) + 3).rem_euclid(7) as usize
    }

    /// 1-based day of the year.
    pub fn ordinal(&self) -> u32 {
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let leap = u32::from(self.month > 2 && is_leap(self.year));
        CUM[(self.month.clamp(1, 12) - 1) as usize] + self.day + leap
    }

    /// `strftime` in the C locale, as glibc implements the common directives (including the
    /// `%-d` no-padding flag). Unknown directives are copied through unchanged.
    pub fn strftime(&self, fmt: &str) -> String {
        let mut out = String::new();
        let mut chars = fmt.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let no_pad = chars.peek() == Some(&'-');
            if no_pad {
                chars.next();
            }
            let Some(d) = chars.next() else {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                break;
            };
            let num = |v: u32, w: usize| {
                if no_pad {
                    v.to_string()
                } else {
                    format!("{v:0w$}")
                }
            };
            let wd = self.weekday();
            let month_name = MONTHS[(self.month.clamp(1, 12) - 1) as usize];
            let h12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            let piece = match d {
                'a' => WEEKDAYS[wd][..3].to_string(),
                'A' => WEEKDAYS[wd].to_string(),
                'b' | 'h' => month_name[..3].to_string(),
                'B' => month_name.to_string(),
                'd' => num(self.day, 2),
                'e' => {
                    if no_pad {
                        self.day.to_string()
                    } else {
                        format!("{:2}", self.day)
                    }
                }
                'm' => num(self.month, 2),
                'Y' => self.year.to_string(),
                'y' => num(self.year.rem_euclid(100) as u32, 2),
                'C' => num((self.year / 100) as u32, 2),
                'H' => num(self.hour, 2),
                'I' => num(h12, 2),
                'M' => num(self.minute, 2),
                'S' => num(self.second, 2),
                'p' => (if self.hour < 12 { "AM" } else { "PM" }).to_string(),
                'j' => num(self.ordinal(), 3),
                'u' => (wd + 1).to_string(),
                'w' => ((wd + 1) % 7).to_string(),
                'f' => num(0, 6),
                'z' | 'Z' => String::new(),
                'D' => self.strftime("%m/%d/%y"),
                'F' => self.strftime("%Y-%m-%d"),
                'T' => self.strftime("%H:%M:%S"),
                'R' => self.strftime("%H:%M"),
                'c' => self.strftime("%a %b %e %H:%M:%S %Y"),
                'x' => self.strftime("%m/%d/%y"),
                'X' => self.strftime("%H:%M:%S"),
                'n' => "\n".to_string(),
                't' => "\t".to_string(),
                '%' => "%".to_string(),
                other => {
                    let mut s = String::from('%');
                    if no_pad {
                        s.push('-');
                    }
                    s.push(other);
                    s
                }
            };
            out.push_str(&piece);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_roundtrip_and_weekday() {
        // 2025-03-07T14:05:09Z = 1741356309
        let dt = DateTime::from_unix(1_741_356_309);
        assert_eq!(
            dt,
            DateTime {
                year: 2025,
                month: 3,
                day: 7,
                hour: 14,
                minute: 5,
                second: 9
            }
        );
        assert_eq!(dt.weekday(), 4); // Friday
        assert_eq!(
            DateTime::from_unix(951_782_400).strftime("%Y-%m-%d %j"),
            "2000-02-29 060"
        );
    }

    #[test]
    fn strftime_directives() {
        let dt = DateTime {
            year: 2025,
            month: 3,
            day: 7,
            hour: 14,
            minute: 5,
            second: 9,
        };
        assert_eq!(dt.strftime("%d %b %Y"), "07 Mar 2025");
        assert_eq!(dt.strftime("%B %-d, %Y"), "March 7, 2025");
        assert_eq!(dt.strftime("%A %I:%M %p %%"), "Friday 02:05 PM %");
        assert_eq!(dt.strftime("%c"), "Fri Mar  7 14:05:09 2025");
        assert_eq!(dt.strftime("%j %u %w %F %T"), "066 5 5 2025-03-07 14:05:09");
    }
}
