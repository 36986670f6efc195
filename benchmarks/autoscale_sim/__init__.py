"""Replay traffic through a GPU + CPU-INT8 queueing model, driven by the real policy and by strong baselines.

Model (1 s steps, every controller sees the same world):
- pools: replicas with a per-replica throughput and a start-up delay with jitter; requests spread evenly over ready
  replicas, each an M/M/1 queue (TEI serves one batch at a time) plus a fluid backlog under overload, and each
  replica rejects beyond TEI's --max-concurrent-requests (512);
- a second violates the SLO when the p95 of the mixture of both pools' latency distributions (weighted by the
  traffic each receives) exceeds it, or when more than 5% of its requests are rejected;
- what controllers see is what TEI exposes: counters (te_request_count/success/failure), the te_queue_size gauge
  and te_request_duration as TEI's histogram (buckets 1e-5 * 1.5^k s, k = 1..35), scraped every 15 s by Prometheus
  and at each of its ticks by the policy (the direct source scrapes the pods itself, every 5 s by default); each
  pool's scrape fails with probability --scrape-failure (default 5%);
- the policy (`rerank_operator.core.autoscale.policy.decide`, the real function) reads them like the direct source:
  deltas between the two latest successful scrapes, p95 by `exposition.quantile` over the bucket deltas, and holds
  when a scrape failed; baselines read them like an HPA or KEDA through Prometheus: rate() over a 1 m window of the
  15 s scrapes, read 8 s after the scrape (their sync is not aligned with the scrape). Those are the production
  defaults, not the policy's cadence: the policy's faster, aligned reads are an advantage of its direct source,
  not of its logic. --baseline-period-s 5 --baseline-lag-s 0 --rate-window-s 15 gives the baselines the policy's
  cadence (the HPA's scale-up limit stays per 15 s, as its default policies are); the JSON's
  parameters.baseline_cadence says which cadence a report compared at;
- decisions take effect after an actuation delay (the delay10 variant: 10 s); cost is replica-seconds (starting
  pods included) x price; each row also has late_fraction, the share of all requests served past the SLO or
  rejected (a violation-second counts the seconds, this the requests: a policy must not trade one for the other
  unseen).
Baselines (each with a tuning factor that cost-matching sweeps):
- hpa_util: the project's old baseline, HPA on capped utilization, CPU pool idle (reference only);
- hpa_rps: HPA v2 on per-pod request rate (uncapped), target f x throughput;
- hpa_queue: HPA on per-pod te_queue_size, target q;
- keda: request-rate and queue triggers, 15 s polling, no scale-down stabilization window;
- fixed_cpu: a fixed CPU share of the traffic, each pool with its own request-rate HPA;
- cap_spill: a capacity-aware spill rule given each pod's true capacity at the SLO (an oracle the policy lacks).
Bounds (--bounds, not baselines): `oracle` knows the true rate every second and each pod's true capacity but not
the future; `foresight` also sees the next 3 minutes (more than a GPU's start-up), the perfect-foresight figure.
Cost-matching: each baseline's sweep is reduced to its Pareto frontier (cost up, violations down) and interpolated
at the policy's cost; a cost outside the swept range takes the nearest end and is flagged `extrapolated`. The same
frontier is also read the other way (`violation_matched`): what each baseline would pay for the policy's
violations, and the cheapest that reaches them (`policy_vs_cheapest_at_violations`); a ratio of violations at equal
cost alone hides a controller that spends money on traffic no capacity can serve. A baseline whose sweep never
reaches the policy's violations has no cost there (`beyond`).
Traffic shapes: diurnal + spikes (per seed; seeds 9-12 are held out of any tuning and reported apart), slow ramp
50 -> 650 -> 50 rps over 6 h, flat with noise, square waves of 10 and 30 min periods (each seed its own phase, so
edges do not all fall on the controllers' tick grid), and an overload above what all GPUs can serve, 8 seeds each
(with 3, one unlucky cold start or scrape decided a comparison). All traces carry Poisson-like noise.
Recorded traces (--traces a.csv,b.csv: per-second arrivals, `t_s,requests`; ../shared/traces/ has two): each is
scaled so its busiest minute fills 80% of the pools' combined capacity at the SLO (--trace-peak-share; or
--trace-scale, a plain multiplier), replayed whole with --trace-seeds (start-up jitter and failed scrapes differ) and
reported whole (`trace:<name>`) and in two parts: the first 70% (`@tuning`) and the last 30% (`@held_out`, kept out
of any tuning), each controller's violations and cost over those seconds of the same run (`segment`). Their target
is issue 60's: a violation ratio <= 0.9 at matched cost and a cost ratio <= 1.0 at matched violations.
Variants: nominal (CPU start-up 40 s), delay10 (10 s between decision and effect), cpu90 (CPU start-up 90 s);
start-ups have +0-30% jitter in all.
Attribution: each violation-second of each run is given one cause (`attribute`: cold start, spike onset before any
new pod can be ready, the CPU bridge's time, late in a spike, a stale scrape, a recent scale-down, ramps and noise);
`summary[...]["attribution"]` has them for the policy, the best cost-matched baseline and the bounds.
`targets` has issue 12's targets (issue 60's on recorded traces) with `cost_ratio` (cost at matched violations)
beside the violation ratio and, where they cannot all hold, what bounds them: `oracle_ratio` and `foresight_ratio`
(the reactive oracle's and the foresight bound's violations at the policy's cost), `beyond_onset` (the ratio
outside the spikes' onset windows, and the policy's onset seconds alone as a share of the baseline's total) and, for
the delay, `delay_per_episode` (violation-seconds the delay adds per spike with any violation, for the policy and the
oracle, and what they imply).
Each target also has `seed_bootstrap`: the cost-matched ratio over 1000 paired resamples of its seeds (5th, 50th,
95th percentile and the share of draws that meet the goal), so a pooled ratio that holds only for the seeds drawn
shows as such.
The policy runs with the CRD's defaults (spec.autoscaling empty); --ablations adds the policy with each part switched
off, and with the earlier defaults (ABLATIONS).

Run: python -m benchmarks.autoscale_sim --ablations --bounds   (full: 12 seeds, all shapes and variants; JSON)
     python -m benchmarks.autoscale_sim --shapes "" --traces ../shared/traces/azure_llm_2023_code.csv \
         --variants nominal --baseline-period-s 5 --baseline-lag-s 0 --rate-window-s 15 --bounds
                                                                 (recorded traffic, baselines at the policy's cadence)
     python -m benchmarks.autoscale_sim --quick                 (2 seeds of 6 h, nominal variant only)
     python -m benchmarks.autoscale_sim --from-rows OUT.json --format markdown   (the tables again, from a run's JSON)
The JSON has `rows` (one per shape, seed, variant and controller) and `summary` (pooled per shape, per diurnal
seed, tuning seeds 1-8 and held-out seeds 9-12, per variant: the policy, each baseline at its default and
cost-matched, the strongest baseline, the bounds, the ablations).
--format markdown prints the same report as tables instead: the targets, then per shape and variant a row per seed
(and one pooled) with the policy and every baseline at its default and cost-matched on that seed.

Layout, one module per part (each is `benchmarks.autoscale_sim.<module>`): world (the pods, what goes wrong,
TEI's limits), traffic (the shapes and their spikes), observation (TEI's metrics as scraped, what a controller may
read), attribution (one cause per violation-second), simulation (the queueing world and a run of it), controllers
(the policy adapter, the baselines, the bounds), experiments (what one comparison runs), matching (pooling over
seeds, cost-matching), targets (issue 12's targets, their bounds and seed bootstrap), report (the JSON and the
markdown tables), cli (the flags; `__main__` runs it). The policy is the installed operator's
(`rerank_operator.core.autoscale`, imported by name).
"""
