cd /work/main && source scripts/setup.sh >/dev/null 2>&1
cp serve_config.yaml /tmp/probe/serve_config.ongoing.yaml
for cfg in ongoing step1; do
  ray stop --force >/dev/null 2>&1
  cp /tmp/probe/serve_config.$cfg.yaml serve_config.yaml
  PYTHONPATH=. timeout 900 python /tmp/probe/ab.py $cfg 3 1.0 30 2>&1 | grep '^{'
done
cp /tmp/probe/serve_config.ongoing.yaml serve_config.yaml
