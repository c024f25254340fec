"""Machine-speed canary: every 0.5 s, CPU seconds (thread_time) for a fixed unit of pure-Python work."""
import sys, time, json
out = open(sys.argv[1], "w")
def unit():
    s = 0
    for i in range(100000):
        s += i * i
    return s
while True:
    t0, w0 = time.thread_time(), time.monotonic()
    unit()
    out.write(json.dumps([round(time.monotonic(), 3), round((time.thread_time() - t0) * 1000, 3), round((time.monotonic() - w0) * 1000, 3)]) + "\n")
    out.flush()
    time.sleep(0.5)
