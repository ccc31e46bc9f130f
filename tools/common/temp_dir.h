#pragma once
// A private temporary folder removed with everything in it when the object goes away, for the
// models the test tools write on the fly.
#include <string>

namespace ds4::tools {

class TempDir {
  public:
    // Creates <system temp>/<prefix>XXXXXX; throws ds4::Error when that fails.
    explicit TempDir(const std::string &prefix);
    ~TempDir();
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;

    const std::string &path() const { return path_; }

  private:
    std::string path_;
};

}  // namespace ds4::tools
