-- wrk script: POSTs one AdmissionReview (the JSON file in env REVIEW_FILE) and prints p50/p90/p99.
local f = assert(io.open(os.getenv("REVIEW_FILE"), "r"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

-- A fixed rate: each connection waits PAUSE_MS before each request (run.sh sets it from RATE).
local pause = tonumber(os.getenv("PAUSE_MS") or "0")
if pause > 0 then
  function delay()
    return pause
  end
end

function done(summary, latency, requests)
  io.write(string.format("requests %d, errors %d (status %d, timeout %d), %.0f req/s\n",
    summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout,
    summary.errors.status, summary.errors.timeout, summary.requests / (summary.duration / 1e6)))
  for _, p in ipairs({50, 90, 99}) do
    io.write(string.format("p%d %.2f ms\n", p, latency:percentile(p) / 1000))
  end
end
