//! UTC formatting without a calendar dependency.

/// `YYYY-MM-DD HH:MM` (UTC) for milliseconds since the epoch.
pub fn format_utc_minutes(ms: i64) -> String {
    let time = UtcTime::of(ms);
    format!("{} {:02}:{:02}", time.date(), time.hour, time.minute)
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC) for milliseconds since the epoch.
pub fn format_utc_rfc3339(ms: i64) -> String {
    let time = UtcTime::of(ms);
    let (hour, minute, second) = (time.hour, time.minute, time.second);
    format!("{}T{hour:02}:{minute:02}:{second:02}Z", time.date())
}

/// A moment's calendar date and time of day, in UTC.
struct UtcTime {
    year: i64,
    month: u32,
    day: u32,
    hour: i64,
    minute: i64,
    second: i64,
}

impl UtcTime {
    /// The UTC time of milliseconds since the epoch (before 1970 too).
    fn of(ms: i64) -> Self {
        let seconds = ms.div_euclid(1000);
        let of_day = seconds.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
        UtcTime {
            year,
            month,
            day,
            hour: of_day / 3600,
            minute: (of_day % 3600) / 60,
            second: of_day % 60,
        }
    }

    /// `YYYY-MM-DD`.
    fn date(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Strict RFC 3339 (`YYYY-MM-DD`, optionally `THH:MM[:SS[.fraction]]` with `Z` or a `±HH:MM`
/// offset, which is honoured) to milliseconds since the epoch. Years 0000–9999 only; months,
/// days, hours, minutes and seconds must exist. Anything else is `None`.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let text = text.trim();
    let digits = |part: &str, length: usize| -> Option<i64> {
        (part.len() == length && part.bytes().all(|b| b.is_ascii_digit()))
            .then(|| part.parse().ok())
            .flatten()
    };
    let (date, rest) = match text.find(['T', 't', ' ']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let mut date_parts = date.split('-');
    let year = digits(date_parts.next()?, 4)?;
    let month = digits(date_parts.next()?, 2)?;
    let day = digits(date_parts.next()?, 2)?;
    if date_parts.next().is_some() || !(1..=12).contains(&month) {
        return None;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if day < 1 || day > month_days[(month - 1) as usize] {
        return None;
    }
    let (mut seconds_of_day, mut offset_seconds, mut millis) = (0, 0, 0);
    if let Some(rest) = rest {
        let (clock, zone) = match rest.find(['Z', 'z', '+', '-']) {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        let (clock, fraction) = clock.split_once('.').unwrap_or((clock, ""));
        let mut clock_parts = clock.split(':');
        let hour = digits(clock_parts.next()?, 2)?;
        let minute = digits(clock_parts.next()?, 2)?;
        let second = match clock_parts.next() {
            Some(part) => digits(part, 2)?,
            None => 0,
        };
        if clock_parts.next().is_some() || hour > 23 || minute > 59 || second > 60 {
            return None;
        }
        if !fraction.is_empty() {
            if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            millis = format!("{fraction:0<3}")[..3].parse().ok()?;
        }
        seconds_of_day = hour * 3600 + minute * 60 + second.min(59);
        offset_seconds = match zone {
            "" | "Z" | "z" => 0,
            zone => {
                let sign = if zone.starts_with('-') { -1 } else { 1 };
                let (hours, minutes) = zone[1..].split_once(':')?;
                let (hours, minutes) = (digits(hours, 2)?, digits(minutes, 2)?);
                if hours > 23 || minutes > 59 {
                    return None;
                }
                sign * (hours * 3600 + minutes * 60)
            }
        };
    }
    // Days from civil (Hinnant); the ranges above keep every product in range.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + seconds_of_day - offset_seconds) * 1000 + millis)
}

#[cfg(test)]
mod tests {

    #[test]
    fn dates_are_strict_rfc3339_with_offsets_honoured() {
        let nine = parse_rfc3339("2026-03-02T09:00:00Z").unwrap();
        assert_eq!(nine, 1_772_442_000_000);
        for (text, expected) in [
            ("2026-03-02", Some(nine - 9 * 3_600_000)),
            ("2026-03-02T11:00:00+02:00", Some(nine)),
            ("2026-03-02T04:30-04:30", Some(nine)),
            ("2026-03-02T09:00:00.5Z", Some(nine + 500)),
            ("2024-02-29T00:00:00Z", parse_rfc3339("2024-02-29")),
            ("9223372036854775807-01-01", None),
            ("2026-99-01", None),
            ("2026-02-30", None),
            ("2023-02-29", None),
            ("2026-03-02T25:00:00Z", None),
            ("2026-03-02T09:00:00+24:00", None),
            ("2026-3-2", None),
            ("yesterday", None),
            ("", None),
        ] {
            assert_eq!(parse_rfc3339(text), expected, "{text}");
        }
    }
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_utc_minutes(0), "1970-01-01 00:00");
        assert_eq!(format_utc_minutes(1_772_442_351_000), "2026-03-02 09:05");
        assert_eq!(format_utc_rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
