// Fixed, public secrets for the benchmarks only.
export const BENCH_SECRET = 'bench-webhook-secret-0123456789abcdef'
