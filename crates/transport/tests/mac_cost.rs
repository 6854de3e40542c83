//! Measures what the frame MAC costs per MiB, and a loopback round trip of large messages,
//! for the architecture notes. Prints; asserts only correctness, never a time.
//! `cargo test --release -p tessera-transport --test mac_cost -- --nocapture`

mod common;

use std::time::Instant;

use common::{accept_one, cluster_pair, TIMEOUT};
use tessera_transport::wire::{FrameMac, FRAME_HEADER_BYTES};

const MIB: usize = 1 << 20;

#[test]
fn mac_cost_per_mib() {
    let mac = FrameMac::new(&[3; 32]);
    let payload = vec![0x5au8; MIB];
    let header = [0u8; FRAME_HEADER_BYTES];
    let rounds = 256;
    let started = Instant::now();
    let mut last = [0u8; 16];
    for sequence in 0..rounds {
        last = mac.tag(sequence, &header, &payload);
    }
    let seconds = started.elapsed().as_secs_f64();
    assert!(mac.verify(rounds - 1, &header, &payload, &last));
    println!(
        "frame MAC (HMAC-SHA256): {:.3} ms per MiB, {:.0} MiB/s on one core",
        seconds * 1000.0 / rounds as f64,
        rounds as f64 / seconds
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_throughput_of_large_messages() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut client = tessera_transport::connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().unwrap();
    let messages = 64;
    let receiver = tokio::spawn(async move {
        let mut bytes = 0;
        for _ in 0..messages {
            let blob: Vec<u8> = server_side.recv().await.unwrap().unwrap();
            bytes += blob.len();
        }
        bytes
    });
    let blob = vec![0xc3u8; 4 * MIB];
    let started = Instant::now();
    for _ in 0..messages {
        client.send(&blob).await.unwrap();
    }
    let received = receiver.await.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(received, messages * 4 * MIB);
    println!(
        "loopback: {} MiB in 4 MiB messages at {:.0} MiB/s (encode, MAC, TCP, verify, decode)",
        received / MIB,
        received as f64 / MIB as f64 / seconds
    );
}
