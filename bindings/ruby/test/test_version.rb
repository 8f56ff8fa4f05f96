# frozen_string_literal: true

# The gem's version is the project's (CMakeLists.txt's project VERSION), and the gemspec builds.
require_relative "test_helper"
require "rubygems/package"

class VersionTest < Minitest::Test
  GEMSPEC = File.expand_path("../retryd.gemspec", __dir__)

  def project_version
    File.read(File.join(RetrydTest::ROOT, "CMakeLists.txt"))[/project\(retryd VERSION (\d+\.\d+\.\d+)/, 1]
  end

  def test_gem_version_is_the_projects
    refute_nil project_version
    assert_equal project_version, Retryd::VERSION
    assert_equal project_version, Gem::Specification.load(GEMSPEC).version.to_s
  end

  def test_gem_builds_and_holds_the_library_code
    Dir.mktmpdir do |dir|
      out = File.join(dir, "retryd.gem")
      _, err, status = Open3.capture3(Gem.ruby, "-S", "gem", "build", GEMSPEC, "--output", out,
                                      chdir: dir)
      assert status.success?, err
      files = Gem::Package.new(out).spec.files
      %w[lib/retryd.rb lib/retryd/native.rb lib/retryd/client.rb lib/retryd/faraday.rb].each do |f|
        assert_includes files, f
      end
      assert_equal project_version, Gem::Package.new(out).spec.version.to_s
    end
  end

  def test_require_never_needs_the_library_and_a_client_names_what_is_missing
    lib = File.expand_path("../lib", __dir__)
    code = 'require "retryd"; begin; Retryd::Client.new; rescue Retryd::LibraryNotFound => e; ' \
           'puts e.message; exit 7; end'
    out, _, status = Open3.capture3({ "RETRYD_LIBRARY" => "/nonexistent/libretryd.so" },
                                    Gem.ruby, "-I", lib, "-e", code)
    assert_equal 7, status.exitstatus, out
    assert_includes out, "/nonexistent/libretryd.so"
  end
end
