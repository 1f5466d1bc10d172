#!/bin/sh
# make-secrets.sh PKI NAMESPACE NODE... | kubectl apply -f -
#
# The certificates deploy/helm/gpuscope needs, made with `gpuscope certs`, as
# the Secrets its pods mount (printed as YAML; nothing is sent to a cluster):
#   gpuscope-analyzer-tls    ca.pem, analyzer.pem/.key, probe.pem/.key (the probes' client)
#   gpuscope-agent-tls       ca.pem and NODE.pem/NODE.key for every node issued so far
#   gpuscope-prometheus-tls  ca.pem, client.pem/.key (Prometheus scraping /metrics)
# NODE: a GPU node's name (`kubectl get nodes -o name` output works too). PKI
# keeps the CA and every key: run this where the CA lives, never on the
# cluster. Run it again with new nodes: what exists is kept, never re-issued.
#
# Environment: RELEASE (the Helm release, default gpuscope), ANALYZER_NAMES
# (the names agents and people reach the analyzer by; default the release's
# Service names), AGENT_METRICS_NAME (default gpuscope-agent, the chart's
# agent.metricsServerName), GPUSCOPE and KUBECTL (the commands).
set -eu
if [ $# -lt 2 ]; then
    sed -n '2,4p' "$0" >&2
    exit 2
fi
pki=$1
ns=$2
shift 2
release=${RELEASE:-gpuscope}
names=${ANALYZER_NAMES:-"$release-analyzer.$ns.svc $release-analyzer.$ns.svc.cluster.local $release-analyzer.$ns $release-analyzer"}
metrics_name=${AGENT_METRICS_NAME:-gpuscope-agent}
gpuscope=${GPUSCOPE:-gpuscope}
kubectl=${KUBECTL:-kubectl}

issue() {  # FILE COMMAND...: run the command unless FILE exists
    file=$1
    shift
    [ -f "$file" ] || "$@" >&2
}

name_flags=""
for n in $names; do name_flags="$name_flags --name $n"; done
# shellcheck disable=SC2086  # one flag and one name per word
issue "$pki/analyzer.pem" "$gpuscope" certs init "$pki" $name_flags
issue "$pki/probe/client.pem" "$gpuscope" certs client "$pki" --name gpuscope-probe --role reader --out "$pki/probe"
issue "$pki/prometheus/client.pem" "$gpuscope" certs client "$pki" --name prometheus --role reader --out "$pki/prometheus"
for node in "$@"; do
    node=${node#node/}
    # CN and first name the node's (the agent's --host); the shared name is what Prometheus checks
    issue "$pki/agents/$node/agent.pem" "$gpuscope" certs agent "$pki" --host "$node" --name "$metrics_name" \
        --out "$pki/agents/$node"
done

secret() {  # NAME --from-file=...: one Secret as YAML, after a document separator
    echo "---"
    "$kubectl" create secret generic "$@" --namespace "$ns" --dry-run=client --output yaml
}
secret gpuscope-analyzer-tls --from-file="ca.pem=$pki/ca.pem" \
    --from-file="analyzer.pem=$pki/analyzer.pem" --from-file="analyzer.key=$pki/analyzer.key" \
    --from-file="probe.pem=$pki/probe/client.pem" --from-file="probe.key=$pki/probe/client.key"
secret gpuscope-prometheus-tls --from-file="ca.pem=$pki/ca.pem" \
    --from-file="client.pem=$pki/prometheus/client.pem" --from-file="client.key=$pki/prometheus/client.key"
agents=""
for dir in "$pki"/agents/*/; do
    [ -f "${dir}agent.pem" ] || continue
    node=$(basename "$dir")
    agents="$agents --from-file=$node.pem=${dir}agent.pem --from-file=$node.key=${dir}agent.key"
done
# shellcheck disable=SC2086
secret gpuscope-agent-tls --from-file="ca.pem=$pki/ca.pem" $agents
