import { useEffect, useState } from "react";
import { ApiError, api, setCsrf, type SessionInfo } from "./api";
import { SignIn, SignUp } from "./auth";
import { ErrorMessage, Loading, Page } from "./components";
import { Audit } from "./ops/audit";
import { OpsBatches } from "./ops/batches";
import { Deployments } from "./ops/deployments";
import { ModelsCatalogue } from "./ops/models";
import { OpsOverview } from "./ops/overview";
import { Planner } from "./ops/planner";
import { SloPolicies } from "./ops/slo";
import { Tenants } from "./ops/tenants";
import { AdminTokens } from "./ops/tokens";
import { TenantUsers } from "./ops/users";
import { Queues } from "./queues";
import { Link, RouterProvider, useRoute } from "./router";
import { Batches, Keys, Models, Overview, Playground, RequestPage, Requests, SloPage, UsagePage } from "./tenant";

const TENANT_NAV: [string, string][] = [
  ["/", "Overview"],
  ["/keys", "API keys"],
  ["/models", "Models"],
  ["/usage", "Usage"],
  ["/slo", "Service levels"],
  ["/requests", "Requests"],
  ["/batches", "Batches"],
  ["/playground", "Playground"],
];

const OPS_NAV: [string, string][] = [
  ["/ops", "Health"],
  ["/ops/tenants", "Tenants"],
  ["/ops/models", "Models"],
  ["/ops/deployments", "Deployments"],
  ["/ops/queues", "Queues"],
  ["/ops/batches", "Batches"],
  ["/ops/slo", "SLO policies"],
  ["/ops/planner", "Planner"],
  ["/ops/users", "Users"],
  ["/ops/tokens", "Admin tokens"],
  ["/ops/audit", "Audit log"],
];

function Forbidden({ what }: { what: string }) {
  return (
    <Page title="Permission denied">
      <ErrorMessage error={new ApiError(403, what)} />
    </Page>
  );
}

function NotFound() {
  return (
    <Page title="Page not found">
      <p>
        There is no page here. <Link to="/">Go to the start page</Link>.
      </p>
    </Page>
  );
}

function Shell() {
  const { path, navigate } = useRoute();
  const [session, setSession] = useState<SessionInfo | null>(null);
  const [checked, setChecked] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);

  useEffect(() => {
    api<SessionInfo>("/session")
      .then((s) => {
        setCsrf(s.csrf_token);
        setSession(s);
      })
      .catch((e: ApiError) => {
        if (e.status !== 401) setError(e);
      })
      .finally(() => setChecked(true));
  }, []);

  const signedIn = (s: SessionInfo) => {
    setCsrf(s.csrf_token);
    setSession(s);
    navigate(s.user.role === "operator" ? "/ops" : "/");
  };
  const signOut = async () => {
    try {
      await api("/logout", { method: "POST" });
    } catch {
      /* the session is gone either way */
    }
    setSession(null);
    setCsrf("");
    navigate("/login");
  };

  if (!checked) return <Loading what="the console" />;
  if (!session) {
    return (
      <main id="main">
        <ErrorMessage error={error} />
        {path === "/signup" ? <SignUp onSignedIn={signedIn} /> : <SignIn onSignedIn={signedIn} />}
      </main>
    );
  }

  const isOperator = session.user.role === "operator";
  // a tenant's members read and use the playground; its admins manage keys, ask for models and cancel
  // batches (the API enforces the same: baton.control.roles)
  const canManage = session.user.role !== "tenant_member";
  const nav = isOperator ? OPS_NAV : TENANT_NAV;
  let page;
  if (path === "/login" || path === "/signup") page = isOperator ? <OpsOverview /> : <Overview session={session} />;
  else if (path === "/ops" || path.startsWith("/ops/")) {
    if (!isOperator) page = <Forbidden what="Only platform operators may open this page." />;
    else if (path === "/ops") page = <OpsOverview />;
    else if (path === "/ops/tenants") page = <Tenants />;
    else if (path === "/ops/models") page = <ModelsCatalogue />;
    else if (path === "/ops/deployments") page = <Deployments />;
    else if (path === "/ops/queues") page = <Queues />;
    else if (path === "/ops/batches") page = <OpsBatches />;
    else if (path === "/ops/slo") page = <SloPolicies />;
    else if (path === "/ops/planner") page = <Planner />;
    else if (path === "/ops/users") page = <TenantUsers />;
    else if (path === "/ops/tokens") page = <AdminTokens />;
    else if (path === "/ops/audit") page = <Audit />;
    else page = <NotFound />;
  } else if (isOperator) {
    page = path === "/" ? <OpsOverview /> : <Forbidden what="This page belongs to a tenant; operators use the operator pages." />;
  } else if (path === "/") page = <Overview session={session} />;
  else if (path === "/keys") page = <Keys canManage={canManage} />;
  else if (path === "/models") page = <Models canManage={canManage} />;
  else if (path === "/usage") page = <UsagePage />;
  else if (path === "/slo") page = <SloPage />;
  else if (path === "/requests") page = <Requests />;
  else if (path.startsWith("/requests/")) page = <RequestPage id={path.slice("/requests/".length)} />;
  else if (path === "/batches") page = <Batches canManage={canManage} />;
  else if (path === "/playground") page = <Playground />;
  else page = <NotFound />;

  return (
    <>
      <header className="topbar">
        <Link to={isOperator ? "/ops" : "/"} className="brand">
          Baton <span className="muted">{isOperator ? "operator console" : "console"}</span>
        </Link>
        <div className="who">
          <span>
            {session.user.email}
            {session.tenant ? ` · ${session.tenant.display_name}` : ""}
          </span>
          <button type="button" className="secondary" onClick={signOut}>
            Sign out
          </button>
        </div>
      </header>
      <div className="layout">
        <nav aria-label="Console" className="sidenav">
          <ul>
            {nav.map(([to, label]) => (
              <li key={to}>
                <Link to={to}>{label}</Link>
              </li>
            ))}
          </ul>
        </nav>
        <main id="main">{page}</main>
      </div>
    </>
  );
}

export default function App() {
  return (
    <RouterProvider>
      <a href="#main" className="skip">
        Skip to content
      </a>
      <Shell />
    </RouterProvider>
  );
}
