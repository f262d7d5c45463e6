// The operator's Users page (/ops/users): who signs in to an organisation's console, and with which role.
import { useState, type FormEvent } from "react";
import { api } from "../api";
import { Badge, ErrorMessage, InputField, LoadedTable, Page, RowButton, SelectField, fmtTime, useAction, useApi, useForm } from "../components";
import type { Tenant } from "./types";

interface TenantUserRow {
  id: string;
  email: string;
  role: "tenant_admin" | "tenant_member";
  disabled: boolean;
  created_at: string;
  last_login_at: string | null;
}

const ROLES = [
  { id: "tenant_member", name: "member" },
  { id: "tenant_admin", name: "admin" },
];
const ROLE_NAMES: Record<TenantUserRow["role"], string> = { tenant_admin: "admin", tenant_member: "member" };
const BLANK = { email: "", password: "", role: "tenant_member" };

export function TenantUsers() {
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const [tenantId, setTenantId] = useState("");
  const users = useApi<TenantUserRow[]>(tenantId ? `/ops/tenants/${tenantId}/users` : null, [tenantId]);
  const act = useAction(() => users.reload());
  const f = useForm(BLANK);
  const tenant = tenants.data?.find((t) => t.id === tenantId);
  const base = `/ops/tenants/${tenantId}/users`;
  const add = (e: FormEvent) => {
    e.preventDefault();
    act.run(async () => {
      await api(base, { method: "POST", body: f.form });
      f.setForm(BLANK);
    });
  };
  const patch = (u: TenantUserRow, body: Partial<TenantUserRow>) => api(`${base}/${u.id}`, { method: "PATCH", body });
  return (
    <Page title="Users" intro="Who signs in to an organisation's console: add people, change their role, disable or remove them.">
      <ErrorMessage error={tenants.error ?? users.error ?? act.error} />
      <div className="card form">
        <SelectField bare id="users-tenant" label="Organisation" placeholder="Choose an organisation" options={tenants.data} value={tenantId} onChange={(e) => setTenantId(e.target.value)} />
      </div>
      {tenant && (
        <form className="card form" onSubmit={add} aria-labelledby="user-title">
          <h2 id="user-title">Add a user to {tenant.display_name}</h2>
          <InputField bare id="user-email" label="Email" type="email" required maxLength={320} {...f.text("email")} />
          <InputField bare id="user-password" label="First password (at least 12 characters)" type="password" required minLength={12} maxLength={256} autoComplete="new-password" {...f.text("password")} />
          <SelectField bare id="user-role" label="Role" options={ROLES} {...f.text("role")} />
          <button type="submit" disabled={act.busy}>
            Add user
          </button>
        </form>
      )}
      {tenant && (
        <LoadedTable q={users} what="the users" showError={false} aria-label="Users" cols={["Email", "Role", "State", "Last sign-in"]} actions="Actions">
          {(u) => (
            <tr key={u.id}>
              <th scope="row">{u.email}</th>
              <td>{ROLE_NAMES[u.role]}</td>
              <td>{u.disabled ? <Badge tone="bad">disabled</Badge> : <Badge tone="ok">active</Badge>}</td>
              <td>{u.last_login_at ? fmtTime(u.last_login_at) : "never"}</td>
              <td className="actions">
                <RowButton label={u.role === "tenant_admin" ? "Make member" : "Make admin"} target={u.email} className="secondary" disabled={act.busy}
                  onClick={() => act.run(() => patch(u, { role: u.role === "tenant_admin" ? "tenant_member" : "tenant_admin" }))} />{" "}
                {u.disabled ? (
                  <RowButton label="Enable" target={u.email} className="secondary" disabled={act.busy} onClick={() => act.run(() => patch(u, { disabled: false }))} />
                ) : (
                  <RowButton label="Disable" target={u.email} className="danger" disabled={act.busy}
                    onClick={() => act.confirmed(`Disable ${u.email}? They are signed out at once and cannot sign in until enabled.`, () => patch(u, { disabled: true }))} />
                )}{" "}
                <RowButton label="Remove" target={u.email} className="danger" disabled={act.busy}
                  onClick={() => act.confirmed(`Remove ${u.email} from ${tenant.name}? This cannot be undone.`, () => api(`${base}/${u.id}`, { method: "DELETE" }))} />
              </td>
            </tr>
          )}
        </LoadedTable>
      )}
    </Page>
  );
}
