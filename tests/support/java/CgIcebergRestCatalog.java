// A REST catalog server for the tests: Apache Iceberg's own REST adapter and servlet (from
// iceberg-core's test jar) over a JDBC catalog in SQLite, served by Jetty on 127.0.0.1 only,
// answering only requests that carry the bearer token in $CG_REST_TOKEN (never an argument).
// OAuth2 client credentials: POST /v1/oauth/tokens with client_id and client_secret matching
// $CG_REST_CLIENT ("id:secret") answers that token, anything else 401.
// Usage: java -cp ... CgIcebergRestCatalog <sqlite file> <warehouse URI>; prints "PORT <n>".

import jakarta.servlet.DispatcherType;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.net.InetSocketAddress;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.FilterHolder;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class CgIcebergRestCatalog {
  public static void main(String[] args) throws Exception {
    Map<String, String> props = new HashMap<>();
    props.put("catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog");
    props.put("uri", "jdbc:sqlite:" + args[0]);
    props.put("warehouse", args[1]);
    props.put("jdbc.schema-version", "V1");
    props.put("clients", "1"); // one SQLite connection: concurrent commits queue instead of locking each other out
    Catalog catalog = CatalogUtil.buildIcebergCatalog("rest_backend", props, new Configuration());
    String token = System.getenv("CG_REST_TOKEN");
    String client = System.getenv("CG_REST_CLIENT");

    Server server = new Server(new InetSocketAddress("127.0.0.1", 0));
    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    Filter auth = (request, response, chain) -> {
      HttpServletRequest req = (HttpServletRequest) request;
      if (req.getRequestURI().endsWith("/oauth/tokens")) {
        HttpServletResponse r = (HttpServletResponse) response;
        String asked = req.getParameter("client_id") + ":" + req.getParameter("client_secret");
        r.setContentType("application/json");
        if (client != null && client.equals(asked)) {
          r.getWriter().write("{\"access_token\":\"" + token + "\",\"token_type\":\"bearer\",\"expires_in\":3600,"
              + "\"issued_token_type\":\"urn:ietf:params:oauth:token-type:access_token\"}");
        } else {
          r.setStatus(401);
          r.getWriter().write("{\"error\":\"invalid_client\",\"error_description\":\"unknown client\"}");
        }
        return;
      }
      String got = req.getHeader("Authorization");
      if (token != null && !("Bearer " + token).equals(got)) {
        HttpServletResponse r = (HttpServletResponse) response;
        r.setStatus(401);
        r.setContentType("application/json");
        r.getWriter().write("{\"error\":{\"message\":\"Not authorized\",\"type\":\"NotAuthorizedException\",\"code\":401}}");
        return;
      }
      chain.doFilter(request, response);
    };
    context.addFilter(new FilterHolder(auth), "/*", EnumSet.of(DispatcherType.REQUEST));
    server.setHandler(context);
    server.start();
    System.out.println("PORT " + ((ServerConnector) server.getConnectors()[0]).getLocalPort());
    System.out.flush();
    server.join();
  }
}
