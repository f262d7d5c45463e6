// The operator's Batches page (/ops/batches): every tenant's batches per model, their lines by state and
// the open batches with their tenant and progress, refreshed every 5 seconds.
import { useState } from "react";
import type { Batch } from "../api";
import { Badge, Loaded, Page, Progress, Stat, Table, fmtEpoch, fmtInt, stateTone, useApi } from "../components";

/** An open batch, with its tenant. */
interface OpenBatch extends Batch {
  tenant_id: string;
  tenant_name: string;
  tenant_display_name: string;
}

interface ModelBatches {
  model: string;
  /** batches by status: every open one, and those created in the window */
  batches: Record<string, number>;
  /** the same batches' lines by state */
  lines: Record<string, number>;
  open: OpenBatch[];
}

interface BatchesByModel {
  since: string;
  models: ModelBatches[];
  /** open batches were left out of the lists (the oldest are shown) */
  more: boolean;
}

const WINDOWS: [number, string][] = [
  [24, "24 hours"],
  [24 * 7, "7 days"],
  [24 * 30, "30 days"],
];
const LINE_STATES: [string, string][] = [
  ["pending", "Lines waiting"],
  ["running", "Lines running"],
  ["done", "Lines done"],
  ["failed", "Lines failed"],
];
const words = (s: string) => s.replace(/_/g, " ");

function ModelCard({ m }: { m: ModelBatches }) {
  const id = `batches-${m.model}`;
  const statuses = Object.entries(m.batches).sort(([a], [b]) => a.localeCompare(b));
  return (
    <section className="card" aria-labelledby={id} data-model={m.model}>
      <div className="row-between">
        <h2 id={id}>
          <code>{m.model}</code>
        </h2>
        <span className="row">
          <span className="muted">Batches:</span>
          {statuses.map(([status, n]) => (
            <Badge key={status} tone={stateTone(status)}>
              {fmtInt(n)} {words(status)}
            </Badge>
          ))}
        </span>
      </div>
      <div className="stats">
        {LINE_STATES.map(([state, label]) => (
          <Stat key={state} label={label} value={fmtInt(m.lines[state] ?? 0)} />
        ))}
      </div>
      {m.open.length === 0 ? (
        <p className="empty">No batch of this model is running.</p>
      ) : (
        <Table caption={`Running batches of ${m.model}, oldest first`} cols={["Tenant", "Batch", "Status", "Progress", "Created", "Expires"]}>
          {m.open.map((b) => (
            <tr key={b.id}>
              <td>{b.tenant_display_name || b.tenant_name}</td>
              <th scope="row">
                <code>{b.id}</code>
              </th>
              <td>
                <Badge tone={stateTone(b.status)}>{words(b.status)}</Badge>
              </td>
              <td>
                <Progress done={b.request_counts.completed} failed={b.request_counts.failed} total={b.request_counts.total} label={`Requests of ${b.id} ended`} />
              </td>
              <td>{fmtEpoch(b.created_at)}</td>
              <td>{fmtEpoch(b.expires_at)}</td>
            </tr>
          ))}
        </Table>
      )}
    </section>
  );
}

export function OpsBatches() {
  const [hours, setHours] = useState(24);
  const q = useApi<BatchesByModel>(`/ops/batches?hours=${hours}`, [hours], 5000);
  return (
    <Page
      title="Batches"
      intro="Every tenant's Batch API work per model: its batches by status and their requests by state (the running batches whenever they were created), and the running batches themselves."
      actions={
        <div>
          <label htmlFor="batches-window">Batches created in the last</label>{" "}
          <select id="batches-window" value={hours} onChange={(e) => setHours(Number(e.target.value))}>
            {WINDOWS.map(([h, label]) => (
              <option key={h} value={h}>
                {label}
              </option>
            ))}
          </select>
        </div>
      }
    >
      <Loaded q={q} what="batches" isEmpty={(d) => d.models.length === 0} empty="No batch is running, and none ended in this window.">
        {(d) => (
          <>
            {d.more && <p className="muted">Only the oldest running batches are listed here; the counts cover every one.</p>}
            {d.models.map((m) => (
              <ModelCard key={m.model} m={m} />
            ))}
          </>
        )}
      </Loaded>
    </Page>
  );
}
