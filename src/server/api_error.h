#pragma once
// An error the server answers with an OpenAI-shaped JSON body (docs/SERVER.md, Errors):
//   {"error": {"message": M, "type": T, "code": C, "param": P}}
// 4xx for everything a client can get wrong; 500 only for genuine internal failures.
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace ds4::server {

class ApiError : public std::runtime_error {
  public:
    ApiError(int status, std::string message, std::string code = "invalid_request",
             std::string type = "invalid_request_error")
        : std::runtime_error(message),
          status(status),
          code(std::move(code)),
          type(std::move(type)) {}

    int status;
    std::string code, type;
    nlohmann::json extra = nlohmann::json::object();  // more members of "error" (param, ...)
};

// The JSON body of an error.
inline nlohmann::json error_body(int status, const std::string &message, const std::string &code,
                                 const std::string &type = "",
                                 const nlohmann::json &extra = nlohmann::json::object()) {
    nlohmann::json e = {{"message", message},
                        {"type", !type.empty()   ? type
                                 : status >= 500 ? "server_error"
                                                 : "invalid_request_error"},
                        {"code", code}};
    for (const auto &[k, v] : extra.items()) e[k] = v;
    return {{"error", e}};
}

inline nlohmann::json error_body(const ApiError &e) {
    return error_body(e.status, e.what(), e.code, e.type, e.extra);
}

}  // namespace ds4::server
