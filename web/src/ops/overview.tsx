// The operator's start page (/ops): platform totals and each deployment's state, refreshed every 5 seconds.
import { Badge, Empty, ErrorMessage, Page, Stat, fmtInt, stateTone, useApi } from "../components";
import type { Deployment } from "./types";

interface Overview {
  tenants: number;
  deployments: Record<string, number>;
  requests_last_hour: number;
  failed_last_hour: number;
}

export function OpsOverview() {
  const ov = useApi<Overview>("/ops/overview", [], 5000);
  const deps = useApi<Deployment[]>("/ops/deployments", [], 5000);
  return (
    <Page title="Platform health" intro="Tenants, deployments and traffic across the platform.">
      <ErrorMessage error={ov.error} />
      {ov.data && (
        <div className="stats">
          <Stat label="Tenants" value={fmtInt(ov.data.tenants)} />
          <Stat label="Deployments running" value={fmtInt(ov.data.deployments.running ?? 0)} hint={`${fmtInt(Object.values(ov.data.deployments).reduce((a, b) => a + b, 0))} in all`} />
          <Stat label="Requests, last hour" value={fmtInt(ov.data.requests_last_hour)} />
          <Stat label="Failed, last hour" value={fmtInt(ov.data.failed_last_hour)} />
        </div>
      )}
      <div className="card">
        <h2>Deployments</h2>
        {deps.data && deps.data.length === 0 && <Empty>No deployments yet.</Empty>}
        <ul className="health">
          {deps.data?.map((d) => (
            <li key={d.id}>
              <Badge tone={stateTone(d.observed_state)}>{d.observed_state}</Badge> <strong>{d.name}</strong>{" "}
              <span className="muted">
                {d.model} · {d.mode === "pd" ? `P/D ${d.prefill.max}:${d.decode.max}` : "aggregated"}
              </span>
              {d.observed_reason && <span className="muted"> — {d.observed_reason}</span>}
            </li>
          ))}
        </ul>
      </div>
    </Page>
  );
}
