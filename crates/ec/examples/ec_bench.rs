//! Stand-alone form of `tessera bench ec`, for measuring the codec without the CLI:
//!
//! ```sh
//! cargo run --release -p tessera-ec --example ec_bench -- --code 8+2p --strip 128K --seconds 3 -Y
//! ```
//!
//! `-Y` prints the same two machine-readable lines as the CLI; without it, one readable line.

use tessera_ec::{bench, Code};

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("strip size {s:?} is not a number"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        _ => return Err(format!("strip size unit {unit:?} unknown; use K or M")),
    };
    Ok(n * scale)
}

fn main() {
    let mut code = "8+2p".to_string();
    let mut strip = "128K".to_string();
    let mut seconds = 3.0f64;
    let mut machine = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--code" => code = args.next().expect("--code needs a value"),
            "--strip" => strip = args.next().expect("--strip needs a value"),
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds needs a number")
            }
            "-Y" => machine = true,
            other => {
                eprintln!("unknown argument {other:?}; usage: ec_bench [--code 8+2p] [--strip 128K] [--seconds N] [-Y]");
                std::process::exit(2);
            }
        }
    }
    let result = Code::parse(&code)
        .map_err(|e| e.to_string())
        .and_then(|c| Ok((c, parse_size(&strip)?)))
        .and_then(|(c, bytes)| bench::run(c, bytes, seconds).map_err(|e| e.to_string()));
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ec_bench: {e}");
            std::process::exit(1);
        }
    };
    if machine {
        println!(
            "bench:ec:HEADER:version:reserved:reserved:code:stripBytes:kernel:encodeGBps:decodeGBps:"
        );
        println!(
            "bench:ec:0:1:::{}:{}:{}:{:.3}:{:.3}:",
            r.code, r.strip_bytes, r.kernel, r.encode_gbps, r.decode_gbps
        );
    } else {
        println!(
            "{} strip {} B, kernel {}: encode {:.2} GB/s, decode {:.2} GB/s",
            r.code, r.strip_bytes, r.kernel, r.encode_gbps, r.decode_gbps
        );
    }
}
