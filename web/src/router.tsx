// A small router over the History API: every console page lives under /console/.
import { createContext, useContext, useEffect, useState, type ReactNode, type MouseEvent } from "react";

export const BASE = "/console";

function current(): string {
  const p = window.location.pathname;
  const rest = p.startsWith(BASE) ? p.slice(BASE.length) : p;
  return rest === "" ? "/" : rest;
}

const RouteContext = createContext<{ path: string; navigate: (to: string) => void }>({
  path: "/",
  navigate: () => {},
});

export function RouterProvider({ children }: { children: ReactNode }) {
  const [path, setPath] = useState(current());
  useEffect(() => {
    const onPop = () => setPath(current());
    window.addEventListener("popstate", onPop);
    return () => window.removeEventListener("popstate", onPop);
  }, []);
  const navigate = (to: string) => {
    if (to === path) return;
    window.history.pushState({}, "", BASE + to);
    setPath(to);
    window.scrollTo(0, 0);
  };
  return <RouteContext.Provider value={{ path, navigate }}>{children}</RouteContext.Provider>;
}

export function useRoute() {
  return useContext(RouteContext);
}

export function Link({ to, children, className, ...rest }: { to: string; children: ReactNode; className?: string } & Record<string, unknown>) {
  const { navigate, path } = useRoute();
  const onClick = (e: MouseEvent<HTMLAnchorElement>) => {
    if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    navigate(to);
  };
  const active = path === to || (to !== "/" && to !== "/ops" && path.startsWith(to + "/"));
  return (
    <a href={BASE + to} onClick={onClick} className={className} aria-current={active ? "page" : undefined} {...rest}>
      {children}
    </a>
  );
}
