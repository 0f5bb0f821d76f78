//! Durations as users type them (`--timeout=5m`) and ages as kubectl prints them (`3m20s`).

use std::time::Duration;

/// Parses what manifests take (`90s`, `5m`, `1h30m`, `500ms`, `2d`, `1w`: `berth_api`'s
/// durations) or a bare number of seconds; at most `36500d`, as every duration berth takes (a
/// deadline past it would overflow the clock).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let too_long = || berth_api::duration::DurationError::TooLong(text.to_string()).to_string();
    let duration = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(text.parse().map_err(|_| too_long())?)
    } else {
        text.parse::<berth_api::BerthDuration>()
            .map_err(|err| err.to_string())?
            .as_std()
    };
    if duration > berth_api::MAX_DURATION {
        return Err(too_long());
    }
    Ok(duration)
}

/// Prints a duration the way `--timeout` would accept it: `5m`, `1h30m`, `45s`.
pub fn format(duration: Duration) -> String {
    let secs = duration.as_secs();
    if secs == 0 {
        return format!("{}ms", duration.as_millis());
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// kubectl's `HumanDuration`: precise when recent, coarser as it grows.
pub fn human_age(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_users_type() {
        let cases = [
            ("30", Ok(30_000)),
            ("30s", Ok(30_000)),
            ("5m", Ok(300_000)),
            ("1h30m", Ok(5_400_000)),
            ("500ms", Ok(500)),
            ("2d", Ok(172_800_000)),
            ("", Err(())),
            ("5 minutes", Err(())),
            ("m5", Err(())),
            ("5x", Err(())),
            ("36500d", Ok(3_153_600_000_000)),
            ("1w", Ok(604_800_000)),
            ("36501d", Err(())),
            ("213503982334601d", Err(())),
            ("99999999999999999999", Err(())),
            ("200000000000000000000ms", Err(())),
        ];
        for (input, expected) in cases {
            let got = parse(input).map(|d| d.as_millis() as u64).map_err(|_| ());
            assert_eq!(got, expected, "input {input:?}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["5m", "1h30m", "45s", "2h", "500ms"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (185, "3m5s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (47 * 3600, "47h"),
            (50 * 3600, "2d2h"),
            (10 * 86_400, "10d"),
            (3 * 365 * 86_400 + 86_400, "3y1d"),
            (9 * 365 * 86_400, "9y"),
        ];
        for (seconds, expected) in cases {
            assert_eq!(human_age(seconds), expected, "seconds {seconds}");
        }
    }
}
