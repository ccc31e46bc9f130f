// The chat page's files as ds4-server serves them (src/server/webui.h): every file of
// src/server/webui/ embedded byte for byte by the build, "/" naming index.html, and the
// Content-Type of each kind. Serving them over HTTP is tested by test_chat_page.py.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "server/webui.h"

using namespace ds4::server;

namespace {

std::string read_source(const std::string &name) {
    std::ifstream f(std::string(DS4_WEBUI_DIR) + "/" + name, std::ios::binary);
    EXPECT_TRUE(f) << name;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

TEST(Webui, EmbedsEveryFileByteForByte) {
    ASSERT_GE(webui_files().size(), 3u);
    for (const WebFile &f : webui_files()) {
        EXPECT_FALSE(f.body.empty()) << f.name;
        EXPECT_EQ(f.body, read_source(std::string(f.name))) << f.name;
    }
}

TEST(Webui, RootIsTheIndex) {
    const auto root = webui_asset("/");
    ASSERT_TRUE(root);
    EXPECT_EQ(root->name, "index.html");
    EXPECT_EQ(root->content_type, "text/html; charset=utf-8");
    EXPECT_TRUE(root->body.starts_with("<!doctype html>"));
    const auto index = webui_asset("/index.html");
    ASSERT_TRUE(index);
    EXPECT_EQ(index->body, root->body);
}

TEST(Webui, AssetsHaveTheirTypes) {
    EXPECT_EQ(webui_asset("/app.js")->content_type, "text/javascript; charset=utf-8");
    EXPECT_EQ(webui_asset("/style.css")->content_type, "text/css; charset=utf-8");
    EXPECT_EQ(webui_asset("/favicon.svg")->content_type, "image/svg+xml");
}

TEST(Webui, OtherPathsAreNotFiles) {
    for (const char *p : {"", "index.html", "/nothing.js", "/v1/models", "/health", "//",
                          "/webui/app.js", "/app.js/", "/APP.JS", "/../app.js"})
        EXPECT_FALSE(webui_asset(p)) << p;
}

TEST(Webui, ContentTypeByExtension) {
    EXPECT_EQ(webui_content_type("a.html"), "text/html; charset=utf-8");
    EXPECT_EQ(webui_content_type("a.js"), "text/javascript; charset=utf-8");
    EXPECT_EQ(webui_content_type("a.css"), "text/css; charset=utf-8");
    EXPECT_EQ(webui_content_type("a.json"), "application/json");
    EXPECT_EQ(webui_content_type("a.png"), "image/png");
    EXPECT_EQ(webui_content_type("a.ico"), "image/x-icon");
    EXPECT_EQ(webui_content_type("a.txt"), "text/plain; charset=utf-8");
    // Not a known extension, or only the extension: bytes.
    for (const char *n : {"a.jsx", "a", ".js", "a.html.gz", "js"})
        EXPECT_EQ(webui_content_type(n), "application/octet-stream") << n;
}
